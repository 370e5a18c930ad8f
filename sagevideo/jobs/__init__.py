"""What to make (pydantic, no torch): job specs and problem formatting (`specs`), every option of a batch
(`config.GenerateConfig`), job files (`files`)."""

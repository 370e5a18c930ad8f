"""The CogVideoX family: what sagevideo knows of it (`family`, registered in
`sagevideo.pipelines.families`), the built-in tiny model (`tiny`), sagevideo's attention processor
(`processor`) and Ulysses sequence parallelism over a transformer's tokens (`sequence_parallel`)."""

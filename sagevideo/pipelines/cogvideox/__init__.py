"""CogVideoX: sagevideo's attention processor (`processor`) and Ulysses sequence parallelism over
a transformer's video tokens (`sequence_parallel`)."""

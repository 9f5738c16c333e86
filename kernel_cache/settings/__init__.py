"""Settings: the environment's Config, a cache directory's settings file, Triton's watched environment."""

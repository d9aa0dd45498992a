"""Default batching and prefix-reuse settings: torch-free, so the command line is built without
importing the engine."""

DEFAULT_PAGE_SIZE = 16  # tokens per KV page
DEFAULT_CHECKPOINT_SLOTS = 8  # device-tier recurrent-state checkpoint slots
DEFAULT_CHECKPOINT_HOST_BYTES = 16 << 30  # host-tier checkpoint budget without a memory plan
DEFAULT_MAX_RUNNING_REQUESTS = 8  # requests batched concurrently

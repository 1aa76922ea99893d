"""Integrations with other engines: tensor parallelism over torch.distributed (`tensor_parallel`)."""

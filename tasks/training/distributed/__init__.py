"""A gang of leased units trained as N ranks on torch.distributed (docs/distributed.md)."""

"""Edge slicing: export, profile, cut, partition, package and deploy a model as a chain of shards."""

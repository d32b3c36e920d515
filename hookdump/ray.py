"""hookdump on Ray Data (the `ray` extra): `hookdump.ray.dump(dataset, model, out, ...)`
writes the dump format from a Ray Dataset, with an actor pool holding the model.

Example:
    >>> import ray, hookdump.ray
    >>> ds = ray.data.from_items([{"id": f"img{i}", "x": x} for i, x in enumerate(images)])
    >>> d = hookdump.ray.dump(ds, make_model, "s3://bucket/acts", layers=["layer4"],
    ...                       reduce="mean", concurrency=4, num_gpus=1)
"""

from hookdump.engine.on_ray import dump

__all__ = ["dump"]

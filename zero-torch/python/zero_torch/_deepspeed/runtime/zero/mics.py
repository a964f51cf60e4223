"""``deepspeed.runtime.zero.mics`` (DeepSpeed 0.18 and before; 0.19.8 removed MiCS):
``MiCS_Init``, :class:`zero_torch.zero.MiCSInit`. zero's shard groups
(``mics_shard_size``) run in its engine; DeepSpeed's MiCS classes (``MiCS_Optimizer``,
``MiCS_Offload``) are not served."""

from zero_torch.zero import MiCSInit as MiCS_Init  # noqa: F401

__all__ = ["MiCS_Init"]

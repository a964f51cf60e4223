"""The rest of DeepSpeed's engine API that scripts reach: its configuration getters, the
DeepSpeed dataloader, ``offload_states``/``reload_states``, ``empty_partition_cache``, and
a named error for every other ``DeepSpeedEngine`` member zero does not have.

``DEEPSPEED_ENGINE_MEMBERS`` is every public member of DeepSpeed 0.19.8's
``DeepSpeedEngine`` that ``torch.nn.Module`` does not have (``sorted(n for n in
vars(DeepSpeedEngine) if not n.startswith("_") and not hasattr(torch.nn.Module, n))``).
Reading one that zero does not provide raises
:class:`~zero_torch.errors.NotProvidedAttributeError` naming it, instead of falling through
to the model with a confusing "the model has no attribute".
"""

from __future__ import annotations

from typing import Any, Dict, Optional, TYPE_CHECKING

import torch

from .errors import NotProvidedAttributeError, UnsupportedError

if TYPE_CHECKING:
    from ._native import ResolvedConfig

DEEPSPEED_ENGINE_MEMBERS = frozenset(
    [
    "aio_config", "all_gather_scalar", "allreduce_and_copy", "allreduce_bucket",
    "allreduce_gradients", "allreduce_no_retain", "autotp_size", "autotuning_enabled",
    "autotuning_end_profile_step", "autotuning_metric", "autotuning_metric_path",
    "autotuning_model_info_path", "autotuning_profile_model_info",
    "autotuning_start_profile_step", "backward", "bf16_master_weights_and_gradients",
    "bf16_optimizer_states", "bfloat16_enabled", "buffered_allreduce_fallback",
    "checkpoint_serialization_enabled", "checkpoint_tag_validation_enabled",
    "checkpoint_tag_validation_fail", "checkpoint_writer_enabled", "clip_fp32_gradients",
    "coalesce_grad_reduction", "collect_python_gc", "communication_data_type",
    "compile_autosp", "compile_autotp", "compile_zero_optimization_stage",
    "cpuadam_cores_perc", "curriculum_learning_config", "curriculum_learning_enabled",
    "data_efficiency_config", "data_efficiency_enabled", "data_sampling_config",
    "data_sampling_enabled", "dataloader_drop_last", "deepspeed_io", "destroy",
    "dump_state", "dynamic_loss_scale", "dynamic_loss_scale_args", "empty_partition_cache",
    "flops_profiler_detailed", "flops_profiler_enabled", "flops_profiler_module_depth",
    "flops_profiler_output_file", "flops_profiler_profile_step",
    "flops_profiler_recompute_fwd_factor", "flops_profiler_top_modules", "fp16_auto_cast",
    "fp16_enabled", "fp16_master_weights_and_gradients", "get_autosp_backend",
    "get_autotp_backend", "get_batch_info", "get_compile_time", "get_data_parallel_rank",
    "get_data_types", "get_deepcompile_backend", "get_deepspeed_compile_backend",
    "get_global_grad_norm", "get_lr", "get_model_parallel_rank", "get_mom",
    "get_optimizer_configuration", "get_sequence_parallel_group",
    "get_tensor_parallel_rank", "get_type", "get_wall_clock_timers",
    "gradient_accumulation_steps", "gradient_clipping", "gradient_predivide_factor",
    "initial_dynamic_scale", "is_compiled", "is_deepcompile_active",
    "is_deepcompile_enabled", "is_first_weights_partition_group",
    "is_gradient_accumulation_boundary", "is_iterable_style_dataset",
    "is_map_style_dataset", "is_sanity_checks_enabled", "load_checkpoint",
    "load_module_state_dict", "load_moe_state_dict", "load_universal_checkpoint",
    "log_level", "loss_scale", "managed_gradient_accumulation", "memory_breakdown",
    "module_state_dict", "no_sync", "offload_states", "optimizer_legacy_fusion",
    "optimizer_name", "optimizer_params", "postscale_gradients", "print_forward_breakdown",
    "random_ltd_config", "random_ltd_enabled", "random_ltd_initialize",
    "register_compile_pass", "reload_states", "save_16bit_model", "save_checkpoint",
    "save_fp16_model", "scale", "scheduler_name", "scheduler_params",
    "set_custom_curriculum_learning_schedule", "set_data_post_process_func",
    "set_gradient_accumulation_boundary", "set_train_batch_size",
    "set_train_micro_batch_size", "sparse_all_gather", "sparse_allreduce",
    "sparse_allreduce_bucket", "sparse_allreduce_no_retain", "step", "steps_per_print",
    "super_offload", "swap_tensor_config", "tensor_parallel_config", "torch_autocast_dtype",
    "torch_autocast_enabled", "torch_autocast_lower_precision_safe_modules",
    "train_batch_size", "train_micro_batch_size_per_gpu", "use_node_local_storage",
    "uses_parallelization_pass_only", "wall_clock_breakdown", "was_step_applied",
    "zenflow_config", "zero_allgather_bucket_size", "zero_allgather_partitions",
    "zero_allgather_sequential", "zero_allow_untested_optimizer", "zero_compute_grad_norm",
    "zero_contiguous_gradients", "zero_cpu_offload", "zero_elastic_checkpoint",
    "zero_force_ds_cpu_optimizer", "zero_gather_16bit_weights_on_model_save",
    "zero_hpz_partition_size", "zero_ignore_unused_parameters", "zero_legacy_stage1",
    "zero_load_from_fp32_weights", "zero_log_trace_cache_warnings",
    "zero_max_live_parameters", "zero_max_reuse_distance",
    "zero_model_persistence_threshold", "zero_module_granularity_threshold",
    "zero_multi_rank_bucket_allreduce", "zero_nvme_offload_optimizer",
    "zero_offload_optimizer", "zero_offload_param", "zero_optimization",
    "zero_optimization_partition_gradients", "zero_optimization_partition_weights",
    "zero_optimization_stage", "zero_overlap_comm", "zero_param_persistence_threshold",
    "zero_parameter_alignment", "zero_partial_offload", "zero_prefetch_bucket_size",
    "zero_quantized_gradients", "zero_quantized_nontrainable_weights",
    "zero_quantized_weights", "zero_reduce_bucket_size", "zero_reduce_scatter",
    "zero_round_robin_gradients", "zero_save_muon_momentum_buffer_in_memory",
    "zero_sub_group_size", "zero_use_cpu_optimizer",
    ]
)


class DeepSpeedEngineAPI:
    """Members of DeepSpeed's engine beyond the training loop (mixed into ``ZeroEngine``)."""

    _config: Dict[str, Any]
    _resolved: ResolvedConfig

    def _zero_section(self) -> Dict[str, Any]:
        return dict(self._config.get("zero_optimization") or {})

    def zero_optimization(self) -> bool:
        """Whether ZeRO is on (stage 1 or more)."""
        return self.zero_optimization_stage() > 0  # type: ignore[attr-defined]

    def zero_optimization_partition_gradients(self) -> bool:
        return self.zero_optimization_stage() >= 2  # type: ignore[attr-defined]

    def zero_optimization_partition_weights(self) -> bool:
        return self.zero_optimization_stage() >= 3  # type: ignore[attr-defined]

    def zero_offload_optimizer(self) -> Optional[Dict[str, Any]]:
        return self._zero_section().get("offload_optimizer")

    def zero_offload_param(self) -> Optional[Dict[str, Any]]:
        return self._zero_section().get("offload_param")

    def zero_use_cpu_optimizer(self) -> bool:
        return self._resolved.offload_optimizer

    def zero_allow_untested_optimizer(self) -> bool:
        return bool(self._config.get("zero_allow_untested_optimizer", False))

    def zero_reduce_bucket_size(self) -> int:
        return int(self._zero_section().get("reduce_bucket_size", 500_000_000))

    def zero_overlap_comm(self) -> bool:
        return bool(self._zero_section().get("overlap_comm", self.zero_optimization_stage() == 3))  # type: ignore[attr-defined]

    def optimizer_params(self) -> Optional[Dict[str, Any]]:
        return (self._config.get("optimizer") or {}).get("params")

    def scheduler_name(self) -> Optional[str]:
        return (self._config.get("scheduler") or {}).get("type")

    def scheduler_params(self) -> Optional[Dict[str, Any]]:
        return (self._config.get("scheduler") or {}).get("params")

    def dataloader_drop_last(self) -> bool:
        return bool(self._config.get("dataloader_drop_last", False))

    def dynamic_loss_scale(self) -> bool:
        fp16 = self._config.get("fp16") or {}
        return bool(fp16.get("enabled")) and fp16.get("loss_scale", 0) == 0

    def loss_scale(self) -> float:
        """The current loss scale (1 unless fp16)."""
        return float(self._native.loss_scale())  # type: ignore[attr-defined]

    def get_data_parallel_rank(self) -> int:
        return int(self.global_rank)  # type: ignore[attr-defined]

    def get_model_parallel_rank(self) -> int:
        return 0

    def get_tensor_parallel_rank(self) -> int:
        return 0

    def deepspeed_io(
        self,
        dataset: Any,
        batch_size: Optional[int] = None,
        route: Any = None,
        pin_memory: bool = True,
        data_sampler: Any = None,
        collate_fn: Any = None,
        num_local_io_workers: Optional[int] = None,
    ) -> torch.utils.data.DataLoader:
        """DeepSpeed's dataloader: this rank's part of ``dataset`` (a
        ``DistributedSampler`` over the data-parallel ranks, shuffled as torch's default),
        micro-batches of ``train_micro_batch_size_per_gpu``, ``dataloader_drop_last`` from
        the config."""
        del route
        if data_sampler is None:
            data_sampler = torch.utils.data.distributed.DistributedSampler(
                dataset, num_replicas=self.dp_world_size, rank=self.global_rank  # type: ignore[attr-defined]
            )
        return torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size or self.train_micro_batch_size_per_gpu(),  # type: ignore[attr-defined]
            sampler=data_sampler,
            collate_fn=collate_fn,
            num_workers=num_local_io_workers or 0,
            pin_memory=pin_memory and self.device.type == "cuda",  # type: ignore[attr-defined]
            drop_last=self.dataloader_drop_last(),
        )

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """DeepSpeed's ``engine.compile()`` (``torch.compile`` of the engine, DeepCompile):
        not part of zero. Refused by name rather than left to ``torch.nn.Module.compile``,
        which would trace zero's hooks and buffers as if they were the model's."""
        raise UnsupportedError(
            "engine.compile() (DeepSpeed's compiled engine and DeepCompile) is not provided by zero: "
            "the engine runs the model as torch runs it, eagerly"
        )

    def offload_states(
        self,
        include: Any = None,
        device: Any = None,
        pin_memory: bool = True,
        non_blocking: bool = False,
    ) -> None:
        """DeepSpeed's ``offload_states`` (move the optimizer states, master weights and
        gradient buffers to the host between phases of a run). On the CPU the engine's
        states already live in host memory: nothing moves. A GPU engine does not offload
        its states on demand yet (configure ``offload_optimizer``/``offload_param``)."""
        del include, pin_memory, non_blocking
        target = getattr(device, "value", device)
        if target not in (None, "cpu"):
            raise UnsupportedError(f"offload_states(device={device!r}): zero offloads states to the CPU only")
        if self.device.type != "cpu":  # type: ignore[attr-defined]
            raise UnsupportedError(
                "offload_states() on a GPU engine is not provided: configure offload_optimizer / "
                "offload_param in the config instead"
            )

    def reload_states(self, non_blocking: bool = False) -> None:
        """DeepSpeed's ``reload_states``, the inverse of :meth:`offload_states` (nothing to
        move on the CPU)."""
        del non_blocking
        if self.device.type != "cpu":  # type: ignore[attr-defined]
            raise UnsupportedError("reload_states() on a GPU engine is not provided")

    def empty_partition_cache(self) -> None:
        """Stage 3: frees every gathered parameter now (DeepSpeed's
        ``empty_partition_cache``); a collective-free release, safe between steps."""
        rt = self._runtime  # type: ignore[attr-defined]
        if rt.native is not None and rt.stage3 and not rt.in_backward:
            rt.abandon()
            rt.refs.clear()

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """DeepSpeed's ``engine.compile`` (DeepCompile, or ``torch.compile`` with ZeRO's
        hooks): not provided; zero's hooks run eagerly."""
        raise UnsupportedError(
            "engine.compile() (DeepCompile / torch.compile of the engine) is not provided by zero: "
            "its hooks run eagerly; compile submodules yourself if you need to"
        )

    def not_provided(self, name: str) -> NotProvidedAttributeError:
        """The error for DeepSpeed engine member ``name`` that zero lacks."""
        return NotProvidedAttributeError(
            f"DeepSpeedEngine.{name} is not provided by zero_torch's engine (docs/DEEPSPEED_API.md "
            "lists the engine members zero has)"
        )

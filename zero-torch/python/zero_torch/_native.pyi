"""Types of zero_torch's native module (``zero-torch/src``, PyO3): every function, class
and method it exports, with the names and defaults of its parameters. Checked against the
built module by ``tests/python/test_native_stub.py`` (each name both ways, each
parameter list against PyO3's ``__text_signature__``), so a Rust change that this file
does not follow fails the tests.

Shapes the Rust side uses: a module's parameters are numbered ``(m, k)`` (module ``m`` in
the engine's order, its ``k``-th parameter); tensors cross as DLPack capsules or buffers
read in place; results come back as the frozen classes below (each with ``as_dict()``),
and checkpoint summaries as JSON text."""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

class ZeroError(RuntimeError): ...
class ConfigError(ZeroError): ...
class CommError(ZeroError): ...
class CheckpointError(ZeroError): ...
class DeviceError(ZeroError): ...
class OrderError(ZeroError): ...

class StepOutcome:
    """What ``step`` (and an external step's begin or finish) did."""

    skipped: bool
    grad_norm: float
    loss_scale: float
    lr: float
    def as_dict(self) -> Dict[str, Any]: ...

class StepCounts:
    """The engine's step counters (DeepSpeed's ``global_steps`` and ``skipped_steps``)."""

    optimizer_steps: int
    skipped_steps: int
    global_steps: int
    def as_dict(self) -> Dict[str, Any]: ...

class MemoryReport:
    """Bytes this rank holds, by kind (``Engine::memory_report``)."""

    params: int
    grads: int
    master: int
    exp_avg: int
    exp_avg_sq: int
    grad_accum: int
    buckets: int
    gathered: int
    peak_gathered: int
    frozen: int
    released: int
    host: int
    comm: int
    model_states: int
    formula: int
    numel: int
    padded_numel: int
    device_total: int
    allocator_used: int
    allocator_peak: int
    device_bound: int
    def as_dict(self) -> Dict[str, Any]: ...

class CommReport:
    """Elements this rank sent in the last step, by purpose, and the theory's count."""

    grad_reduce: int
    param_gather: int
    control: int
    theory: int
    intra_node: int
    inter_node: int
    theory_intra_node: int
    theory_inter_node: int
    def as_dict(self) -> Dict[str, Any]: ...

class HfLoad:
    """What ``load_hf_checkpoint`` read on this rank, and the tensors no parameter took."""

    requested: int
    read: int
    files: int
    seconds: float
    left: List[str]
    def as_dict(self) -> Dict[str, Any]: ...

class ExternalPiece:
    """One parameter's stretch of an external optimizer's shard: elements
    ``element_start:element_end`` of parameter ``(module, param)`` lie at
    ``shard_start:shard_end`` of the group's shard."""

    module: int
    param: int
    shard_start: int
    shard_end: int
    element_start: int
    element_end: int
    def as_dict(self) -> Dict[str, Any]: ...

class LaunchInfo:
    """The job as the launcher describes it (a world of one without one)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: Optional[int]
    master_addr: str
    def as_dict(self) -> Dict[str, Any]: ...

class AdamHyper:
    """Adam's hyper-parameters from the config (each ``f32`` as its shortest decimal)."""

    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    decoupled: bool
    bias_correction: bool
    def as_dict(self) -> Dict[str, Any]: ...

class ResolvedOptimizer:
    """The config's ``optimizer`` section: its type, its ``params`` as JSON text, and
    Adam's hyper-parameters when zero steps it itself."""

    name: str
    params_json: str
    adam: Optional[AdamHyper]
    def as_dict(self) -> Dict[str, Any]: ...

class ResolvedConfig:
    """The config as zero's parser resolves it ("auto" filled in)."""

    optimizer: Optional[ResolvedOptimizer]
    scheduler: bool
    offload_optimizer: bool
    offload_optimizer_partial: bool
    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    gradient_clipping: float
    stage: int
    dtype: str
    gather_16bit_weights_on_model_save: bool
    param_persistence_threshold: int
    notes: List[str]
    def as_dict(self) -> Dict[str, Any]: ...

ParamEntry = Tuple[str, List[int], bool, List[str], int]
"""One parameter as the engine is told it: name, shape, trained or frozen, its other full
names (tied weights), and its optimizer parameter group."""
ModuleArg = Tuple[str, List[ParamEntry]]
"""One module: its name and its parameters."""
ImportedTensors = Tuple[str, Any, Optional[Any], Optional[Any]]
"""A parameter's name and its ``(master, exp_avg, exp_avg_sq)`` float tensors."""
LossScaleState = Tuple[float, Optional[Tuple[int, int, int]]]
"""A loss scaler's scale and, if dynamic, ``(cur_iter, last_overflow_iter, cur_hysteresis)``."""
Fp32Entry = Tuple[List[str], List[int], bool, bytes]
"""One parameter of a checkpoint as fp32: its names, shape, trainable, little-endian bytes."""
RawTensor = Tuple[str, str, List[int], bytes]
"""One tensor of a Hugging Face checkpoint: name, element type as the file names it, shape, bytes."""

class NativeEngine:
    """The engine of this process's rank (``zero_runtime::Engine`` on the CPU, or its CUDA
    form); every method that communicates is called by every rank in the same order."""

    def __new__(
        cls,
        config_json: str,
        modules: Sequence[ModuleArg],
        values: Sequence[Sequence[Any]],
        timeout_s: float = 300.0,
        device: str = "cpu",
        id_exchange: Optional[Callable[[Optional[bytes], float], bytes]] = None,
        machines: Optional[Sequence[int]] = None,
        relay: Optional[Any] = None,
    ) -> "NativeEngine":
        """``machines`` (every rank's machine) and ``relay`` (``_gloo_tier.GlooRelay``):
        CPU ranks on several machines; ``id_exchange`` is then this machine's."""
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    def fetch(self, m: int) -> None:
        """Gathers module ``m``'s partitioned parameters (stage 3)."""
    def release(self, m: int) -> None:
        """Frees module ``m``'s gathered parameters (stage 3)."""
    def abandon_pass(self) -> None: ...
    def wait_collectives(self) -> None: ...
    def param_persistent(self, m: int, k: int) -> bool: ...
    def views(self, m: int, ks: Sequence[int]) -> List[Any]:
        """DLPack capsules over parameters ``ks`` of module ``m``."""
    def held(self, m: int, k: int) -> Any:
        """What this rank keeps of parameter ``(m, k)`` between uses (DeepSpeed's ``ds_tensor``)."""
    def storage_ranges(self) -> List[Tuple[int, int]]: ...
    def cross(self, stream: Optional[int] = None) -> None: ...
    def adopt_params(self, params: Sequence[Tuple[int, int, Any]]) -> None: ...
    def put_grad(self, m: int, k: int, grad: Any, stream: Optional[int] = None) -> bool:
        """Counts and writes trainable parameter ``k`` of module ``m``'s gradient; whether the
        module is now complete (declared ready by the engine)."""
    def predict_grads(self, modules: Sequence[int]) -> bool:
        """One gradient per backward for each trainable parameter of ``modules``; whether the
        engine now expects something."""
    def expectation(self) -> str:
        """``"unknown"``, ``"predicted"`` or ``"learned"``."""
    def grads_complete(self, m: int) -> bool: ...
    def end_backward(self, release: Sequence[int]) -> bool:
        """Declares the modules not yet complete ready, releasing each of ``release`` right
        after its declaration (or after them all); whether this backward was the first."""
    def set_params(self, params: Sequence[Tuple[int, int, Any]], root: int) -> None: ...
    def loss_scale_factor(self) -> float: ...
    def loss_scale(self) -> float: ...
    def step(self) -> StepOutcome: ...
    def micro_steps(self) -> int:
        """DeepSpeed's ``engine.micro_steps``."""
    def passes_since_step(self) -> int: ...
    def declare_boundary(self, boundary: bool) -> None:
        """DeepSpeed's ``set_gradient_accumulation_boundary``."""
    def is_gradient_accumulation_boundary(self) -> bool: ...
    def backward_call(self) -> None:
        """``backward()`` begins: a declared boundary applies to its pass."""
    def begin_pass(self) -> None:
        """A backward of this engine begins: a second one before ``step()`` reopens the micro-step."""
    def step_call(self) -> bool:
        """``step()``: counts a micro-step; whether the optimizer steps now."""
    def group_count(self) -> int: ...
    def set_group(
        self,
        g: int,
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        weight_decay: float,
        decoupled: bool,
        bias_correction: bool,
    ) -> None: ...
    def set_group_lr(self, g: int, lr: float) -> None: ...
    def group_lrs(self) -> List[float]: ...
    def step_external_begin(self) -> Optional[StepOutcome]: ...
    def external_group_len(self, g: int) -> int: ...
    def external_group_pieces(self, g: int) -> List[ExternalPiece]: ...
    def external_read(self, g: int, what: str, out: Any) -> None: ...
    def step_external_finish(self, masters: Sequence[Any]) -> StepOutcome: ...
    def step_external_abort(self) -> None: ...
    def import_state(
        self,
        params: Sequence[ImportedTensors],
        optimizer_steps: int,
        skipped_steps: int,
        global_steps: int,
        loss_scale: Optional[LossScaleState] = None,
        lr_last_batch_iteration: Optional[int] = None,
        strict: bool = True,
    ) -> None: ...
    def zero_grad(self) -> None:
        """Discards the step's gradients and the window's counters (a collective)."""
    def lr(self) -> float: ...
    def step_counts(self) -> StepCounts: ...
    def memory_report(self) -> MemoryReport: ...
    def comm_report(self) -> CommReport: ...
    def save_checkpoint(
        self,
        save_dir: str,
        tag: Optional[str] = None,
        client_state_json: str = "{}",
        exclude_frozen_parameters: bool = False,
    ) -> str: ...
    def load_checkpoint(
        self,
        load_dir: str,
        tag: Optional[str] = None,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_only: bool = False,
        strict: bool = True,
    ) -> str: ...
    def load_hf_checkpoint(
        self,
        path: str,
        strict: bool = True,
        prefix: Optional[str] = None,
        ignore: Sequence[str] = ...,
        round_to: Optional[str] = None,
    ) -> HfLoad: ...
    def save_16bit_model(self, save_dir: str) -> List[str]: ...
    def save_hf_weights(self, save_dir: str, max_shard_bytes: int, dtype: str) -> List[str]: ...

def launch_info() -> LaunchInfo: ...
def resolve_config(config_json: str, world_size: int) -> ResolvedConfig:
    """The config resolved by zero's parser, with its checks and "did you mean" errors."""
def read_client_state(checkpoint_dir: str, tag: Optional[str] = None) -> str: ...
def read_checkpoint_summary(checkpoint_dir: str, tag: Optional[str] = None) -> str: ...
def read_fp32_state(checkpoint_dir: str, tag: Optional[str] = None) -> List[Fp32Entry]: ...
def read_hf_tensors(path: str, names: Sequence[str]) -> List[RawTensor]: ...
def pin_mmap_threshold(bytes: int) -> bool: ...

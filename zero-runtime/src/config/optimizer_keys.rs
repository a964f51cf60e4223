//! The `optimizer` section's keys and its Adam family's `params` (DeepSpeed's
//! `optimizer` config, FusedAdam's and torch's Adam arguments), with their rows of
//! docs/CONFIG.md.

use super::keys::{DocNames, Fixed, Key, KeyDefault, Section};
use super::top_keys::OPTIMIZER;

/// The `optimizer` section.
pub(super) const OPTIMIZER_SECTION: Section = Section {
    path: OPTIMIZER.name,
    names: DocNames::Path,
    keys: &[
        TYPE.doc(TYPE_DOC),
        Key {
            default: KeyDefault::Text(PARAMS_DEFAULT),
            ..PARAMS
        }
        .doc(PARAMS_DOC),
    ],
};

/// `optimizer.params` of `Adam` and `AdamW`.
pub(super) const ADAM_PARAMS: Section = Section {
    path: "optimizer.params",
    names: DocNames::Path,
    keys: &[
        LR,
        BETAS,
        EPS,
        WEIGHT_DECAY,
        BIAS_CORRECTION,
        ADAM_W_MODE,
        TORCH_ADAM,
        Key::new("fp32_optimizer_states", KeyDefault::Bool(true)),
        Key::new("set_grad_none", KeyDefault::Bool(true)),
        Key::new("foreach", KeyDefault::Text("none")),
        Key::only("amsgrad", Fixed::Bool(false)),
        Key::only("fused", Fixed::Null),
        Key::only("maximize", Fixed::Bool(false)),
        Key::only("capturable", Fixed::Bool(false)),
        Key::only("differentiable", Fixed::Bool(false)),
    ],
};

/// The optimizer's (or scheduler's) name.
pub(super) const TYPE: Key = Key::new("type", KeyDefault::Text("—"));

/// The optimizer's (or scheduler's) arguments.
pub(super) const PARAMS: Key = Key::new("params", KeyDefault::Text("{}"));

/// The learning rate.
pub(super) const LR: Key = Key::new("lr", KeyDefault::Float(1e-3));

/// Adam's two decay rates.
pub(super) const BETAS: Key = Key::new("betas", KeyDefault::Pair(0.9, 0.999));

/// Adam's epsilon.
pub(super) const EPS: Key = Key::new("eps", KeyDefault::Float(1e-8));

/// The weight decay.
pub(super) const WEIGHT_DECAY: Key = Key::new(
    "weight_decay",
    KeyDefault::Text("0 (torch's AdamW, `torch_adam` with decoupled decay: 0.01)"),
);

/// Whether Adam corrects its moments' bias.
pub(super) const BIAS_CORRECTION: Key = Key::new("bias_correction", KeyDefault::Bool(true));

/// Whether `Adam` decays the weights decoupled (as AdamW).
pub(super) const ADAM_W_MODE: Key = Key::new("adam_w_mode", KeyDefault::Bool(true));

/// Whether DeepSpeed builds torch's Adam/AdamW rather than its FusedAdam.
pub(super) const TORCH_ADAM: Key = Key::new("torch_adam", KeyDefault::Bool(false));

/// The doc row of `optimizer.type`.
const TYPE_DOC: &str =
    "`Adam` or `AdamW` (any case): zero's fused Adam. **DeepSpeed's `Adam` is FusedAdam \
    with `adam_w_mode: true`**: decoupled weight decay unless `\"adam_w_mode\": false`; \
    `AdamW` is always decoupled. Any other name is an *external* optimizer: zero-runtime \
    does not step it itself (`Engine::step_external_*` hands each rank's fp32 shard to a \
    front-end; zero_torch builds `torch.optim.<type>` over it, as DeepSpeed does: `SGD`, \
    `Adagrad`, `RMSprop`, ...). DeepSpeed's own `Lamb`, `Lion`, `OneBitAdam`, \
    `ZeroOneAdam`, `OneBitLamb`, `MuAdam(W)`, `MuSGD`, `Muon` are errors naming them; \
    `max_grad_norm` in `params` is an error pointing at `gradient_clipping` (as DeepSpeed)";

/// The default column of `optimizer.params`'s doc row.
const PARAMS_DEFAULT: &str =
    "lr 1e-3, betas [0.9, 0.999], eps 1e-8, **weight_decay 0**, bias_correction true";

/// The doc row of `optimizer.params`.
const PARAMS_DOC: &str =
    "DeepSpeed builds `Adam`/`AdamW` as its FusedAdam (or DeepSpeedCPUAdam with offload), \
    whose weight decay defaults to 0, for `AdamW` too. With `\"torch_adam\": true` it \
    builds `torch.optim.AdamW`, whose weight decay defaults to 0.01 (`torch.optim.Adam` \
    with `adam_w_mode: false`: 0). `fp32_optimizer_states`, `set_grad_none`, `foreach` are \
    read; `amsgrad: true` is an error";

//! What a trainer registers: parameters grouped into modules, in execution order.

/// One parameter tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    /// Name, unique within its module.
    pub name: String,
    /// Shape; the element count is its product.
    pub shape: Vec<usize>,
    /// Whether it is trained (has gradients and optimizer state).
    pub trainable: bool,
    /// Other full names of the same tensor (tied weights: GPT-2's `lm_head.weight` is
    /// `transformer.wte.weight`). Checkpoints record them, and exports write the tensor
    /// under each, so a state dict loads under every name the model has.
    pub aliases: Vec<String>,
    /// The optimizer parameter group it belongs to (0 unless set): each group steps with
    /// its own hyper-parameters ([`Engine::set_group`](crate::Engine::set_group)), as a
    /// torch optimizer's `param_groups` do (no weight decay on biases and norms, say).
    pub group: usize,
}

impl ParamSpec {
    /// A trainable parameter.
    pub fn new(name: impl Into<String>, shape: &[usize]) -> Self {
        Self {
            name: name.into(),
            shape: shape.to_vec(),
            trainable: true,
            aliases: Vec::new(),
            group: 0,
        }
    }

    /// The same parameter in optimizer parameter group `group`.
    pub fn in_group(mut self, group: usize) -> Self {
        self.group = group;
        self
    }

    /// The same parameter, also known by the full names `aliases` (tied weights).
    pub fn with_aliases(mut self, aliases: Vec<String>) -> Self {
        self.aliases = aliases;
        self
    }

    /// A frozen parameter: no gradient, no optimizer state, never reduced. Whole on every
    /// rank below stage 3; at stage 3 partitioned and gathered with its module like a
    /// trained one (whole if at or under the persistence threshold).
    pub fn frozen(name: impl Into<String>, shape: &[usize]) -> Self {
        Self {
            trainable: false,
            ..Self::new(name, shape)
        }
    }

    /// Element count.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A module: the unit the trainer fetches before its forward and backward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleSpec {
    /// Name, for errors and reports.
    pub name: String,
    /// Its parameters, in the order views are handed out.
    pub params: Vec<ParamSpec>,
}

impl ModuleSpec {
    /// A module with these parameters.
    pub fn new(name: impl Into<String>, params: Vec<ParamSpec>) -> Self {
        Self {
            name: name.into(),
            params,
        }
    }
}

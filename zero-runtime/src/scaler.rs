//! Loss scaling with DeepSpeed's exact semantics (`DynamicLossScaler.update_scale`).

use crate::config::{LossScaleConfig, Precision};

/// The loss scale has reached its minimum and an overflow asks to lower it again.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("current loss scale {scale} is already at the minimum ({min}) and the gradients overflowed again - cannot decrease the scale any further")]
pub struct LossScaleAtMinimum {
    /// The scale when it happened.
    pub scale: f64,
    /// `min_loss_scale`.
    pub min: f64,
}

/// What the scaler did at a step boundary.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScaleChange {
    /// No change.
    Kept,
    /// Overflow with hysteresis left: the scale stays, hysteresis drops to this.
    HysteresisLowered(u64),
    /// Overflow: the scale fell from the first to the second value.
    Lowered(f64, f64),
    /// A full window of good steps: the scale doubled to this.
    Raised(f64),
}

/// A static or dynamic loss scaler; bf16 and fp32 use a static scale of 1.
#[derive(Debug, Clone, PartialEq)]
pub struct LossScaler {
    cur_scale: f64,
    dynamic: Option<Dynamic>,
}

#[derive(Debug, Clone, PartialEq)]
struct Dynamic {
    cfg: LossScaleConfig,
    cur_iter: i64,
    last_overflow_iter: i64,
    cur_hysteresis: u64,
}

pub use zero_checkpoint::format::{DynamicState, ScalerState};

impl LossScaler {
    /// Its state.
    pub fn state(&self) -> ScalerState {
        ScalerState {
            scale: self.cur_scale,
            dynamic: self.dynamic.as_ref().map(|d| DynamicState {
                cur_iter: d.cur_iter,
                last_overflow_iter: d.last_overflow_iter,
                cur_hysteresis: d.cur_hysteresis,
            }),
        }
    }

    /// Takes `state` (a checkpoint's) where it is of the same kind (dynamic or static);
    /// returns whether it did.
    pub fn restore(&mut self, state: &ScalerState) -> bool {
        match (&mut self.dynamic, &state.dynamic) {
            (Some(d), Some(s)) => {
                d.cur_iter = s.cur_iter;
                d.last_overflow_iter = s.last_overflow_iter;
                d.cur_hysteresis = s.cur_hysteresis;
                self.cur_scale = state.scale;
                true
            }
            (None, None) => {
                self.cur_scale = state.scale;
                true
            }
            _ => false,
        }
    }

    /// The scaler a precision calls for: dynamic for fp16 with `loss_scale` 0, static
    /// otherwise.
    pub fn new(precision: &Precision) -> Self {
        match precision {
            Precision::Fp16(cfg) if cfg.loss_scale == 0.0 => Self {
                cur_scale: 2f64.powi(cfg.initial_scale_power as i32),
                dynamic: Some(Dynamic {
                    cfg: *cfg,
                    cur_iter: 0,
                    last_overflow_iter: -1,
                    cur_hysteresis: cfg.hysteresis,
                }),
            },
            Precision::Fp16(cfg) => Self {
                cur_scale: cfg.loss_scale,
                dynamic: None,
            },
            _ => Self {
                cur_scale: 1.0,
                dynamic: None,
            },
        }
    }

    /// The current scale.
    pub fn scale(&self) -> f64 {
        self.cur_scale
    }

    /// Updates after a step boundary that did (`overflow`) or did not overflow.
    pub fn update(&mut self, overflow: bool) -> Result<ScaleChange, LossScaleAtMinimum> {
        let Some(d) = &mut self.dynamic else {
            return Ok(ScaleChange::Kept);
        };
        let mut change = ScaleChange::Kept;
        if overflow {
            if d.cfg.hysteresis == 1 || d.cur_hysteresis == 1 {
                if self.cur_scale == d.cfg.min_loss_scale {
                    return Err(LossScaleAtMinimum {
                        scale: self.cur_scale,
                        min: d.cfg.min_loss_scale,
                    });
                }
                let next = (self.cur_scale / 2.0).max(d.cfg.min_loss_scale);
                change = ScaleChange::Lowered(self.cur_scale, next);
                self.cur_scale = next;
            } else {
                d.cur_hysteresis -= 1;
                change = ScaleChange::HysteresisLowered(d.cur_hysteresis);
            }
            d.last_overflow_iter = d.cur_iter;
        } else {
            if d.cfg.consecutive_hysteresis {
                d.cur_hysteresis = d.cfg.hysteresis;
            }
            let stable = d.cur_iter - d.last_overflow_iter - 1;
            if stable > 0 && stable % d.cfg.loss_scale_window as i64 == 0 {
                if !d.cfg.consecutive_hysteresis {
                    d.cur_hysteresis = d.cfg.hysteresis;
                }
                self.cur_scale *= 2.0;
                change = ScaleChange::Raised(self.cur_scale);
            }
        }
        d.cur_iter += 1;
        Ok(change)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp16(window: u64, hysteresis: u64, consecutive: bool, min: f64) -> Precision {
        Precision::Fp16(LossScaleConfig {
            loss_scale: 0.0,
            initial_scale_power: 4,
            loss_scale_window: window,
            hysteresis,
            consecutive_hysteresis: consecutive,
            min_loss_scale: min,
        })
    }

    #[test]
    fn window_doubling_counts_stable_steps_after_the_last_overflow() {
        // DeepSpeed: stable = cur_iter - last_overflow_iter - 1, doubling when a positive
        // multiple of the window. From the start (last_overflow_iter = -1) the first
        // doubling comes at iteration `window`, i.e. after window + 1 good steps.
        let mut s = LossScaler::new(&fp16(3, 2, false, 1.0));
        let scales: Vec<f64> = (0..8)
            .map(|_| {
                s.update(false).unwrap();
                s.scale()
            })
            .collect();
        assert_eq!(scales, vec![16.0, 16.0, 16.0, 32.0, 32.0, 32.0, 64.0, 64.0]);
    }

    #[test]
    fn hysteresis_delays_the_halving_and_refills_on_doubling() {
        let mut s = LossScaler::new(&fp16(2, 2, false, 1.0));
        assert_eq!(s.update(true).unwrap(), ScaleChange::HysteresisLowered(1));
        assert_eq!(s.scale(), 16.0);
        assert_eq!(s.update(true).unwrap(), ScaleChange::Lowered(16.0, 8.0));
        // Still hysteresis 1 (not consecutive): the next overflow halves at once.
        assert_eq!(s.update(true).unwrap(), ScaleChange::Lowered(8.0, 4.0));
        // iter 3, 4 good: stable = 0 then 1; iter 5: stable 2 → double and refill.
        s.update(false).unwrap();
        s.update(false).unwrap();
        assert_eq!(s.update(false).unwrap(), ScaleChange::Raised(8.0));
        assert_eq!(s.update(true).unwrap(), ScaleChange::HysteresisLowered(1));
    }

    #[test]
    fn consecutive_hysteresis_refills_on_every_good_step() {
        let mut s = LossScaler::new(&fp16(100, 2, true, 1.0));
        assert_eq!(s.update(true).unwrap(), ScaleChange::HysteresisLowered(1));
        s.update(false).unwrap();
        assert_eq!(s.update(true).unwrap(), ScaleChange::HysteresisLowered(1));
    }

    #[test]
    fn overflow_at_the_minimum_is_an_error() {
        let mut s = LossScaler::new(&fp16(100, 1, false, 4.0));
        assert_eq!(s.update(true).unwrap(), ScaleChange::Lowered(16.0, 8.0));
        assert_eq!(s.update(true).unwrap(), ScaleChange::Lowered(8.0, 4.0));
        let e = s.update(true).unwrap_err();
        assert!(e.to_string().contains("already at the minimum"), "{e}");
    }

    #[test]
    fn static_and_non_fp16_scalers_never_move() {
        let mut s = LossScaler::new(&Precision::Bf16);
        assert_eq!(s.update(true).unwrap(), ScaleChange::Kept);
        assert_eq!(s.scale(), 1.0);
    }
}

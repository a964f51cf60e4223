//! DeepSpeed's LR schedules, with DeepSpeed's timing: the schedule starts at
//! `last_batch_iteration = -1` and advances once after every step that was not skipped,
//! so optimizer step `k` (from 0) uses the LR at iteration `k − 1` (the minimum LR, or a
//! ratio of 0, for the very first step, as in DeepSpeed).

use crate::config::{SchedulerConfig, WarmupType};

/// The learning rate for a schedule (or a constant LR without one).
#[derive(Debug, Clone, PartialEq)]
pub struct LrSchedule {
    base_lr: f64,
    cfg: Option<SchedulerConfig>,
    last_batch_iteration: i64,
}

impl LrSchedule {
    /// A schedule over the optimizer's `lr`.
    pub fn new(base_lr: f64, cfg: Option<SchedulerConfig>) -> Self {
        Self {
            base_lr,
            cfg,
            last_batch_iteration: -1,
        }
    }

    /// The LR the next optimizer step uses (for the base LR the schedule was made with).
    pub fn lr(&self) -> f64 {
        self.lr_for(self.base_lr)
    }

    /// The LR the next optimizer step uses for a parameter group whose own `lr` is
    /// `base`: DeepSpeed's schedules start from each group's `lr` where the config does
    /// not fix the value (`warmup_max_lr` absent; `WarmupCosineLR`'s ratios always).
    pub fn lr_for(&self, base: f64) -> f64 {
        let it = self.last_batch_iteration;
        let Some(cfg) = self.cfg else {
            return base;
        };
        let warm = |warmup: WarmupType, steps: u64| -> Option<f64> {
            let steps = steps.max(2);
            (it < steps as i64).then(|| match warmup {
                WarmupType::Log => ((it + 1) as f64).ln() / (steps as f64).ln(),
                WarmupType::Linear => it as f64 / steps as f64,
            })
        };
        match cfg {
            SchedulerConfig::WarmupLr {
                min_lr,
                max_lr,
                warmup_steps,
                warmup,
            } => {
                if it < 0 {
                    return min_lr;
                }
                let max_lr = max_lr.unwrap_or(base);
                min_lr + (max_lr - min_lr) * warm(warmup, warmup_steps).unwrap_or(1.0)
            }
            SchedulerConfig::WarmupDecayLr {
                min_lr,
                max_lr,
                warmup_steps,
                warmup,
                total_steps,
            } => {
                if it < 0 {
                    return min_lr;
                }
                let max_lr = max_lr.unwrap_or(base);
                let gamma = warm(warmup, warmup_steps).unwrap_or_else(|| {
                    let w = warmup_steps.max(2) as f64;
                    (0f64).max((total_steps as f64 - it as f64) / (total_steps as f64 - w).max(1.0))
                });
                min_lr + (max_lr - min_lr) * gamma
            }
            SchedulerConfig::WarmupCosineLr {
                warmup_min_ratio,
                warmup_steps,
                cos_min_ratio,
                warmup,
                total_steps,
            } => {
                if it < 0 {
                    return 0.0;
                }
                let ratio = match warm(warmup, warmup_steps) {
                    Some(r) => warmup_min_ratio + r * (1.0 - warmup_min_ratio),
                    None => {
                        let w = warmup_steps.max(2) as i64;
                        let real_last = (it - w + 1) as f64;
                        let real_total = (total_steps as i64 - w).max(1) as f64;
                        let progress = (real_last / real_total).min(1.0);
                        let r = (1.0 + (std::f64::consts::PI * progress).cos()) / 2.0;
                        (cos_min_ratio + (1.0 - cos_min_ratio) * r).max(0.0)
                    }
                };
                base * ratio
            }
        }
    }

    /// Its position: DeepSpeed's `last_batch_iteration`.
    pub fn last_batch_iteration(&self) -> i64 {
        self.last_batch_iteration
    }

    /// Moves to a saved position.
    pub fn set_last_batch_iteration(&mut self, it: i64) {
        self.last_batch_iteration = it;
    }

    /// Advances after a step that was taken (DeepSpeed does not advance on skipped steps).
    pub fn advance(&mut self) {
        self.last_batch_iteration += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lrs(mut s: LrSchedule, n: usize) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let lr = s.lr();
                s.advance();
                lr
            })
            .collect()
    }

    #[test]
    fn warmup_lr_log_starts_at_min_and_reaches_max() {
        let s = LrSchedule::new(
            1.0,
            Some(SchedulerConfig::WarmupLr {
                min_lr: 0.0,
                max_lr: Some(0.1),
                warmup_steps: 4,
                warmup: WarmupType::Log,
            }),
        );
        let got = lrs(s, 7);
        // Step 0 uses iteration -1 (min); then 0.1·ln(it+1)/ln(4) for it < 4.
        let want = [
            0.0,
            0.0,
            0.1 * 2f64.ln() / 4f64.ln(),
            0.1 * 3f64.ln() / 4f64.ln(),
            0.1,
            0.1,
            0.1,
        ];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-15, "{got:?}");
        }
    }

    #[test]
    fn warmup_decay_lr_decays_linearly_to_zero() {
        let s = LrSchedule::new(
            1.0,
            Some(SchedulerConfig::WarmupDecayLr {
                min_lr: 0.0,
                max_lr: Some(1.0),
                warmup_steps: 2,
                warmup: WarmupType::Linear,
                total_steps: 6,
            }),
        );
        let got = lrs(s, 9);
        // it: -1 0 1 | 2: (6-2)/4=1, 3: .75, 4: .5, 5: .25, 6: 0, 7: 0 (clamped)
        assert_eq!(got, vec![0.0, 0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0]);
    }

    #[test]
    fn warmup_cosine_lr_ends_at_the_floor() {
        let s = LrSchedule::new(
            2.0,
            Some(SchedulerConfig::WarmupCosineLr {
                warmup_min_ratio: 0.0,
                warmup_steps: 2,
                cos_min_ratio: 0.1,
                warmup: WarmupType::Linear,
                total_steps: 4,
            }),
        );
        let got = lrs(s, 8);
        assert_eq!(got[0], 0.0);
        assert_eq!(got[1], 0.0); // it 0: linear ratio 0
        assert_eq!(got[2], 1.0); // it 1: ratio 0.5
                                 // it 2: progress 1/2 → ratio 0.1 + 0.9·0.5 = 0.55
        assert!((got[3] - 1.1).abs() < 1e-12, "{got:?}");
        assert!(
            (got[4] - 0.2).abs() < 1e-12 && (got[7] - 0.2).abs() < 1e-12,
            "{got:?}"
        );
    }

    #[test]
    fn an_unset_max_lr_is_each_groups_own_lr() {
        let s = LrSchedule::new(
            0.5,
            Some(SchedulerConfig::WarmupLr {
                min_lr: 0.0,
                max_lr: None,
                warmup_steps: 2,
                warmup: WarmupType::Linear,
            }),
        );
        assert_eq!(s.lr(), 0.0);
        let mut s = s;
        s.advance();
        s.advance();
        s.advance();
        assert_eq!((s.lr(), s.lr_for(2.0)), (0.5, 2.0));
    }

    #[test]
    fn no_scheduler_is_the_constant_lr() {
        assert_eq!(lrs(LrSchedule::new(0.3, None), 3), vec![0.3; 3]);
    }
}

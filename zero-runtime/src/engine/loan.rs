//! A buffer a bucket owns and lends to collectives: its 16-bit parameters (lent to the
//! step's all-gathers where the stage keeps the bucket whole) and its reduced gradients
//! (lent to a reduction: stage 0's all-reduce, stage 1's reduce-scatter of the whole
//! bucket, the reduce-scatter of stages 2–3 that writes the partition).
//!
//! The communicator takes a buffer by value until the collective is waited for, so while
//! one runs the bucket cannot hold it. The engine waits for a collective before it reads
//! what the collective took ([`Engine::settle`](super::Engine) for the reductions, which
//! the engine finishes in the order it issued them; the step's gathers before it
//! returns), so a buffer it finds lent went with a collective whose wait failed: its
//! error ([`EngineError::Comm`]) was returned then, and now the buffer's is
//! [`EngineError::Lost`], naming it.
//!
//! ```text
//!          lend()    (a collective takes it)
//!   Held ─────────────────────────────────────► Lent
//!    ▲                                            │
//!    └──────── put_back(buf)  (its wait) ─────────┘
//!                    a failed wait: Lent for good (read: EngineError::Lost)
//! ```

use crate::EngineError;

/// A buffer held by its bucket or lent to a collective (see the module docs).
pub(super) struct Loan<B> {
    /// `None` while lent.
    buf: Option<B>,
    /// What it is, for the error: "bucket 3's gradients".
    what: What,
}

/// What a [`Loan`] holds, for its error.
#[derive(Debug, Clone, Copy)]
pub(super) enum What {
    /// The bucket's 16-bit parameters.
    Params(usize),
    /// The bucket's gradients (stages 0–1) or gradient partition (stages 2–3).
    Grads(usize),
}

impl What {
    fn lost(self) -> EngineError {
        EngineError::Lost(match self {
            What::Params(b) => format!("bucket {b}'s parameters"),
            What::Grads(b) => format!("bucket {b}'s gradients"),
        })
    }
}

impl<B> Loan<B> {
    /// A held buffer.
    pub(super) fn held_by(buf: B, what: What) -> Self {
        Self {
            buf: Some(buf),
            what,
        }
    }

    /// The held buffer, or `None` while lent (the memory report counts what is held).
    pub(super) fn held(&self) -> Option<&B> {
        self.buf.as_ref()
    }

    /// Whether a collective has it.
    pub(super) fn is_lent(&self) -> bool {
        self.buf.is_none()
    }

    /// The held buffer; lent, only after a failed collective.
    pub(super) fn get(&self) -> Result<&B, EngineError> {
        self.buf.as_ref().ok_or_else(|| self.what.lost())
    }

    /// The held buffer, to write in place.
    pub(super) fn get_mut(&mut self) -> Result<&mut B, EngineError> {
        let what = self.what;
        self.buf.as_mut().ok_or_else(|| what.lost())
    }

    /// Held → Lent: the buffer, for a collective.
    pub(super) fn lend(&mut self) -> Result<B, EngineError> {
        self.buf.take().ok_or_else(|| self.what.lost())
    }

    /// Lent → Held: the collective gave it back (or a new buffer replaces it).
    pub(super) fn put_back(&mut self, buf: B) -> &mut B {
        self.buf.insert(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loan_is_held_lent_and_put_back_and_a_lent_one_is_named_lost() {
        let mut loan = Loan::held_by(vec![1.0f32, 2.0], What::Grads(3));
        assert!(!loan.is_lent());
        assert_eq!(loan.get().unwrap(), &[1.0, 2.0]);
        loan.get_mut().unwrap()[0] = 5.0;
        let buf = loan.lend().unwrap();
        assert_eq!(buf, [5.0, 2.0]);
        assert!(loan.is_lent() && loan.held().is_none());
        for err in [
            loan.get().unwrap_err(),
            loan.get_mut().unwrap_err(),
            loan.lend().unwrap_err(),
        ] {
            assert!(
                matches!(&err, EngineError::Lost(what) if what == "bucket 3's gradients"),
                "{err}"
            );
        }
        loan.put_back(buf)[1] = 7.0;
        assert_eq!(loan.held().unwrap(), &[5.0, 7.0]);
        let mut params = Loan::<Vec<f32>>::held_by(Vec::new(), What::Params(0));
        params.lend().unwrap();
        assert_eq!(
            params.get().unwrap_err().to_string(),
            "bucket 0's parameters went with a collective that failed (its error was returned then): this engine cannot go on; start again from the last checkpoint"
        );
    }
}

//! How the ranks agree during a save or load: short texts (a tag, a result, an error)
//! broadcast from rank 0 or all-gathered, over the engine's own communicator and device
//! buffers (one byte per `f32`, exact). A rank that never joins makes the others fail by
//! the communicator's timeout, with an error saying what they were doing.

use super::super::Engine;
use crate::checkpoint::CheckpointError;
use crate::device::Device;
use crate::EngineError;
use zero_comm::{Communicator, Completion};
use zero_kernels::DType;

/// The longest text exchanged, in bytes.
pub(super) const TEXT_MAX: usize = 2048;

/// `s` cut to at most `max` bytes, at a character boundary.
pub(super) fn clip(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn encode(text: &str) -> Vec<f32> {
    let t = clip(text, TEXT_MAX);
    let mut v = vec![0f32; TEXT_MAX + 1];
    v[0] = t.len() as f32;
    for (d, b) in v[1..].iter_mut().zip(t.bytes()) {
        *d = b as f32;
    }
    v
}

fn decode(v: &[f32]) -> String {
    let n = (v[0].max(0.0) as usize).min(TEXT_MAX);
    let bytes: Vec<u8> = v[1..=n].iter().map(|&x| x as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn collective(during: &str) -> impl FnOnce(EngineError) -> EngineError + '_ {
    move |e| match e {
        EngineError::Comm(c) => CheckpointError::Collective {
            during: during.to_string(),
            reason: c.to_string(),
        }
        .into(),
        other => other,
    }
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Rank 0's `text`, on every rank.
    pub(super) fn broadcast_text(
        &mut self,
        text: &str,
        during: &str,
    ) -> Result<String, EngineError> {
        let run = |e: &mut Self| -> Result<String, EngineError> {
            let mut buf = e.dev.zeros(DType::F32, TEXT_MAX + 1)?;
            if e.shard.rank == 0 {
                e.dev.upload_f32(&mut buf, 0, &encode(text))?;
            }
            let work = e.issue(|c| &mut c.control, |comm| comm.broadcast(buf, 0))?;
            let out = work.wait()?;
            Ok(decode(&e.dev.download_f32(&out, 0..TEXT_MAX + 1)?))
        };
        run(self).map_err(collective(during))
    }

    /// Every rank's `text`, in rank order, on every rank.
    pub(super) fn gather_texts(
        &mut self,
        text: &str,
        during: &str,
    ) -> Result<Vec<String>, EngineError> {
        let run = |e: &mut Self| -> Result<Vec<String>, EngineError> {
            let len = TEXT_MAX + 1;
            let mut input = e.dev.zeros(DType::F32, len)?;
            e.dev.upload_f32(&mut input, 0, &encode(text))?;
            let output = e.dev.zeros(DType::F32, len * e.shard.size)?;
            let work = e.issue(|c| &mut c.control, |comm| comm.all_gather(input, output))?;
            let (_, all) = work.wait()?;
            let all = e.dev.download_f32(&all, 0..len * e.shard.size)?;
            Ok(all.chunks_exact(len).map(decode).collect())
        };
        run(self).map_err(collective(during))
    }

    /// Every rank's outcome of a local part: `Ok` where all succeeded; else this rank's
    /// own error, or the first failing rank's.
    pub(super) fn agree_outcome<E: Into<EngineError> + std::fmt::Display>(
        &mut self,
        mine: Result<(), E>,
        during: &str,
    ) -> Result<(), EngineError> {
        let text = match &mine {
            Ok(()) => String::new(),
            Err(e) => format!("!{}", clip(&e.to_string(), TEXT_MAX - 1)),
        };
        let all = self.gather_texts(&text, during)?;
        mine.map_err(Into::into)?;
        match all.iter().enumerate().find(|(_, t)| t.starts_with('!')) {
            Some((rank, t)) => Err(CheckpointError::RankFailed {
                rank,
                message: t[1..].to_string(),
            }
            .into()),
            None => Ok(()),
        }
    }
}

impl<C: Communicator, D: Device<Buffer = C::Buffer>> Engine<C, D> {
    /// Runs a save on replica 0's shard group only: with `mics_shard_size` the other
    /// replicas hold the same state, and two writers of one file would race. Every replica
    /// then gets replica 0's outcome (`text` of its result, or its error), and the others
    /// return `from_text` of it. Without replicas, just `save`.
    pub(in crate::engine) fn on_replica_zero<T>(
        &mut self,
        during: &str,
        save: impl FnOnce(&mut Self) -> Result<T, EngineError>,
        text: impl Fn(&T) -> String,
        from_text: impl FnOnce(String) -> T,
    ) -> Result<T, EngineError> {
        let layout = self.comm.layout();
        if layout.replicas() == 1 {
            return save(self);
        }
        let mine = if layout.replica() == 0 {
            Some(save(self))
        } else {
            None
        };
        let said = match &mine {
            Some(Ok(t)) => format!("+{}", text(t)),
            Some(Err(e)) => format!("!{}", clip(&e.to_string(), TEXT_MAX - 1)),
            None => String::new(),
        };
        let run = |e: &mut Self| -> Result<String, EngineError> {
            let mut buf = e.dev.zeros(DType::F32, TEXT_MAX + 1)?;
            if layout.replica() == 0 {
                e.dev.upload_f32(&mut buf, 0, &encode(&said))?;
            }
            let work = e.issue(|c| &mut c.control, |comm| comm.replicas_broadcast(buf, 0))?;
            let out = work.wait()?;
            Ok(decode(&e.dev.download_f32(&out, 0..TEXT_MAX + 1)?))
        };
        let told = run(self).map_err(collective(during))?;
        match mine {
            Some(outcome) => outcome,
            None => match told.strip_prefix('+') {
                Some(t) => Ok(from_text(t.to_string())),
                None => Err(CheckpointError::RankFailed {
                    rank: 0,
                    message: format!(
                        "replica 0 (the shard group that writes) failed: {}",
                        told.strip_prefix('!').unwrap_or(&told)
                    ),
                }
                .into()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_survive_the_f32_encoding() {
        for t in ["", "global_step12", "ünïcødé ✓", &"x".repeat(TEXT_MAX + 10)] {
            let back = decode(&encode(t));
            assert_eq!(back, clip(t, TEXT_MAX));
        }
        assert_eq!(clip("aé", 2), "a");
    }
}

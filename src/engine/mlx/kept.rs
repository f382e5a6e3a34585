//! What the engine thread keeps between jobs: a state's caches and the
//! answers already read on it ([`Snapshot`], the prefix cache's entry), and
//! the prompts kept in the prefix cache by their token ids
//! ([`PromptIndex`]), so that a completion continues the longest kept
//! prompt its own starts with.

use std::collections::HashMap;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::cache::ModelCache;
use crate::engine::prefix_cache::{PrefixCache, StateHash, Weighed};
use crate::engine::{QuestionScore, QuestionTokens};

/// The model's caches after a state's prefix, as the prefix cache keeps them,
/// with the scores of questions already answered on it.
pub(super) struct Snapshot {
    pub cache: ModelCache,
    /// A kept prompt's final hidden state at its last position, so that the
    /// same prompt again (a vLLM-backend gateway reading more than one
    /// request's worth of letter ids on it) is answered from it, as vLLM's
    /// prefix cache answers it.
    pub last: Option<mlx_rs::Array>,
    /// The caches' bytes and room for `answers_per_state` answers.
    bytes: usize,
    pub answers: Mutex<HashMap<[u8; 32], QuestionScore>>,
}

impl Snapshot {
    pub fn new(cache: ModelCache, answer_room: usize) -> Self {
        Snapshot {
            bytes: cache.nbytes() + answer_room,
            cache,
            last: None,
            answers: Mutex::new(HashMap::new()),
        }
    }

    /// A kept prompt's snapshot, with its last position's hidden state.
    pub fn of_prompt(cache: ModelCache, last: mlx_rs::Array) -> Self {
        let mut snapshot = Snapshot::new(cache, last.nbytes());
        snapshot.last = Some(last);
        snapshot
    }
}

/// What identifies a question's scores on one state: its suffix, the ids
/// read, whether hidden states were asked for and of which block.
pub(super) fn answer_key(q: &QuestionTokens, hidden: bool, layer: Option<usize>) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((q.suffix.len() as u64).to_le_bytes());
    for t in q.suffix.iter().chain(&q.read) {
        h.update(t.to_le_bytes());
    }
    h.update([u8::from(hidden)]);
    if hidden {
        h.update(layer.map_or(u64::MAX, |l| l as u64).to_le_bytes());
    }
    h.finalize().into()
}

// SAFETY: a snapshot holds MLX array handles that are never mutated after
// the snapshot is made (continuing from it clones the handles), and it is
// only created, read and dropped by the engine thread; the prefix cache's
// type bounds need Send + Sync, which MLX arrays do not declare.
unsafe impl Send for Snapshot {}
unsafe impl Sync for Snapshot {}

impl Weighed for Snapshot {
    fn nbytes(&self) -> usize {
        self.bytes
    }
}

/// Prompts whose snapshots are in the prefix cache, by a hash of their
/// token ids, so that a completion finds the longest kept prompt its own
/// starts with. Bounded: the oldest entries are forgotten past
/// [`PromptIndex::CAPACITY`] (their snapshots stay until the cache evicts
/// them); an entry whose snapshot was evicted is simply a miss.
#[derive(Default)]
pub(super) struct PromptIndex {
    /// (length, hash of the ids) → the snapshot's key in the prefix cache.
    keys: HashMap<(usize, [u8; 32]), StateHash>,
    /// How many entries have each length.
    lengths: std::collections::BTreeMap<usize, usize>,
    order: std::collections::VecDeque<(usize, [u8; 32])>,
}

impl PromptIndex {
    const CAPACITY: usize = 4096;

    fn hash(ids: &[u32]) -> [u8; 32] {
        let mut h = Sha256::new();
        for id in ids {
            h.update(id.to_le_bytes());
        }
        h.finalize().into()
    }

    pub fn record(&mut self, ids: &[u32], key: StateHash) {
        let k = (ids.len(), Self::hash(ids));
        if self.keys.insert(k, key).is_some() {
            return;
        }
        *self.lengths.entry(k.0).or_default() += 1;
        self.order.push_back(k);
        while self.order.len() > Self::CAPACITY {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            self.keys.remove(&old);
            if let Some(n) = self.lengths.get_mut(&old.0) {
                *n -= 1;
                if *n == 0 {
                    self.lengths.remove(&old.0);
                }
            }
        }
    }

    /// Keys of kept prompts that `prompt` strictly extends, longest first.
    pub fn prefixes_of(&self, prompt: &[u32]) -> Vec<(usize, StateHash)> {
        self.prefixes_where(prompt, |_| true)
    }

    /// [`Self::prefixes_of`] among the kept lengths that `wanted` accepts.
    /// The prompt's tokens are hashed once, in order, whatever the number
    /// of lengths looked up.
    pub fn prefixes_where(
        &self,
        prompt: &[u32],
        wanted: impl Fn(usize) -> bool,
    ) -> Vec<(usize, StateHash)> {
        let mut found = Vec::new();
        if prompt.len() < 2 {
            return found;
        }
        let mut h = Sha256::new();
        let mut hashed = 0;
        for &len in self.lengths.range(1..prompt.len()).map(|(len, _)| len) {
            if !wanted(len) {
                continue;
            }
            for id in &prompt[hashed..len] {
                h.update(id.to_le_bytes());
            }
            hashed = len;
            if let Some(key) = self.keys.get(&(len, h.clone().finalize().into())) {
                found.push((len, *key));
            }
        }
        found.reverse();
        found
    }
}

/// The key under which a completion's prompt is kept.
pub(super) fn prompt_key(ids: &[u32]) -> StateHash {
    StateHash::new("", "", "completion-prompt", ids)
}

/// The prefix cache and its index of prompts, for the generate path.
pub(super) struct Kept<'a> {
    pub cache: &'a PrefixCache<Snapshot>,
    pub index: &'a mut PromptIndex,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_finds_the_kept_prefixes_of_a_prompt_longest_first() {
        let prompt: Vec<u32> = (0..40).collect();
        let mut index = PromptIndex::default();
        for len in [8, 16, 20, 32] {
            index.record(&prompt[..len], prompt_key(&prompt[..len]));
        }
        // Another prompt of a kept length that is not a prefix of this one.
        index.record(&[7; 24], prompt_key(&[7; 24]));
        index.record(&prompt, prompt_key(&prompt));
        let lengths = |found: Vec<(usize, StateHash)>| {
            for &(len, key) in &found {
                assert_eq!(key, prompt_key(&prompt[..len]));
            }
            found.into_iter().map(|(len, _)| len).collect::<Vec<_>>()
        };
        assert_eq!(lengths(index.prefixes_of(&prompt)), [32, 20, 16, 8]);
        assert_eq!(
            lengths(index.prefixes_where(&prompt, |len| len % 8 == 0)),
            [32, 16, 8]
        );
        assert_eq!(lengths(index.prefixes_of(&prompt[..20])), [16, 8]);
        let mut other = prompt.clone();
        other[10] = 99;
        assert_eq!(lengths(index.prefixes_of(&other)), [8]);
    }
}

//! Decisions on the vLLM backend whose questions share one request
//! (`multi_question` `warm`, the default): a state's questions go upstream
//! as one completions request whose `prompt` is the list of their token-id
//! prompts, one token each, the option letters read by the probed method
//! ([`super::reading`]) from the choice of each prompt. vLLM schedules the
//! prompts of one request together and its prefix cache shares their
//! state; nothing is sent ahead of them. The list is split where it would
//! carry more than `UpstreamLimits::batch_tokens` prompt tokens or
//! `batch_prompts` prompts, and letters beyond the 128 a request may name
//! (`MAX_LOGPROB_TOKEN_IDS`) are asked in further list requests of the same
//! prompts; all of a decision's list requests go out at once
//! (`docs/design/vllm.md`, "One request per state").

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use futures::StreamExt;

use super::head;
use super::probe::Probed;
use super::protocol::{
    by_prompt, cached_tokens, choice_position, letter_request, state_found, CompletionRequest,
    CompletionResponse, Prompt, MAX_LOGPROB_TOKEN_IDS,
};
use super::reading::letters_at;
use super::{score_timeout, Inner, LetterMethod};
use crate::engine::{EngineError, QuestionScore, ScoreRequest, ScoreResult};

/// The states the gateway sent upstream lately, so that a list request's
/// cached-token count is believed only for a state sent before: vLLM
/// reports the count of a request's last prompt, and the earlier prompts of
/// the same list put the state in its prefix cache just before it.
pub struct SentStates {
    most: usize,
    keys: Mutex<Recent>,
}

/// State hashes, as a set and in the order they were sent.
#[derive(Default)]
struct Recent {
    set: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

impl SentStates {
    pub fn new(most: usize) -> Self {
        SentStates {
            most,
            keys: Mutex::new(Recent::default()),
        }
    }

    /// Whether `key` was sent before; remembers it from now on (the oldest
    /// forgotten past `most`).
    fn sent_before(&self, key: [u8; 32]) -> bool {
        let Ok(mut keys) = self.keys.lock() else {
            return false;
        };
        let Recent { set, order } = &mut *keys;
        if set.contains(&key) {
            return true;
        }
        set.insert(key);
        order.push_back(key);
        while order.len() > self.most {
            if let Some(old) = order.pop_front() {
                set.remove(&old);
            }
        }
        false
    }
}

/// One list request: the positions of its questions, and which of the
/// letters it names (a range of the group's letters).
struct Part {
    questions: Vec<usize>,
    letters: std::ops::Range<usize>,
}

/// The questions (positions) in lists of at most `most_prompts` prompts
/// and `most_tokens` prompt tokens, in order; a prompt over the token bound
/// goes alone.
fn split(
    questions: &[usize],
    lengths: &[usize],
    most_tokens: usize,
    most_prompts: usize,
) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut tokens = 0;
    for &q in questions {
        let len = lengths[q];
        match out.last_mut() {
            Some(list) if list.len() < most_prompts && tokens + len <= most_tokens => {
                list.push(q);
                tokens += len;
            }
            _ => {
                out.push(vec![q]);
                tokens = len;
            }
        }
    }
    out
}

/// The questions in groups that may share a request, each with the letters
/// it names: every question together, naming the union of their letters,
/// where every upstream reads letters by token ids (each id's
/// log-probability is over the whole vocabulary, whichever others are
/// named) or by the top k (which names none); otherwise (allowed tokens
/// renormalise over the named set) the questions with the same letters.
/// With the second of the pair: whether letters are read by token ids,
/// at most [`MAX_LOGPROB_TOKEN_IDS`] a request.
fn groups(inner: &Inner, request: &ScoreRequest) -> (Vec<Group>, bool) {
    let methods: Vec<LetterMethod> = inner
        .pool
        .upstreams
        .iter()
        .filter_map(|u| u.probed().map(|p| p.method))
        .collect();
    let shared = !methods.contains(&LetterMethod::AllowedTokens);
    let by_ids = methods.iter().all(|m| *m == LetterMethod::TokenIds);
    let mut out: Vec<Group> = Vec::new();
    for (i, q) in request.questions.iter().enumerate() {
        if shared {
            if out.is_empty() {
                out.push((Vec::new(), Vec::new()));
            }
            let (letters, questions) = &mut out[0];
            for id in &q.read {
                if !letters.contains(id) {
                    letters.push(*id);
                }
            }
            questions.push(i);
        } else if let Some((_, questions)) = out.iter_mut().find(|(l, _)| *l == q.read) {
            questions.push(i);
        } else {
            out.push((q.read.clone(), vec![i]));
        }
    }
    (out, by_ids)
}

/// Questions that share list requests: the letters those name, and the
/// questions' positions.
type Group = (Vec<u32>, Vec<usize>);

/// The list requests of a decision's question groups: each group's
/// questions cut into lists to what may run beside other requests' calls
/// (`--batch-tokens`, `--batch-prompts`, the fair share), each list asked
/// for its group's letters, at most a request's worth of token ids at a
/// time when they are named by id.
fn parts(
    inner: &Inner,
    groups: &[Group],
    by_ids: bool,
    lengths: &[usize],
    suffixes: &[usize],
) -> Vec<(usize, Part)> {
    let limits = &inner.options.limits;
    let fair_room = inner.pool.fair_budget().unwrap_or(usize::MAX);
    let mut parts = Vec::new();
    for (g, (letters, questions)) in groups.iter().enumerate() {
        let step = if by_ids {
            MAX_LOGPROB_TOKEN_IDS
        } else {
            letters.len().max(1)
        };
        let lists = split(
            questions,
            lengths,
            limits.batch_tokens,
            limits.batch_prompts,
        )
        .into_iter()
        .flat_map(|list| split(&list, suffixes, fair_room, usize::MAX));
        for list in lists {
            let mut from = 0;
            loop {
                let to = (from + step).min(letters.len());
                parts.push((
                    g,
                    Part {
                        questions: list.clone(),
                        letters: from..to,
                    },
                ));
                from = to;
                if from >= letters.len() {
                    break;
                }
            }
        }
    }
    parts
}

/// Each question's hidden state from the head upstream, when the decision
/// asks for them: the state embedded alone first, so that each question's
/// embedding continues it (its prefix cache).
async fn hidden_states(
    inner: &Inner,
    request: &ScoreRequest,
    prompts: &[Vec<u32>],
) -> Result<Vec<Option<Vec<f32>>>, EngineError> {
    if !request.hidden {
        return Ok(vec![None; prompts.len()]);
    }
    let key = request.state.0;
    if !request.prefix.is_empty() {
        head::hidden(inner, &key, &request.prefix).await?;
    }
    let all = prompts
        .iter()
        .cloned()
        .map(|p| async move { head::hidden(inner, &key, &p).await.map(Some) });
    futures::stream::iter(all)
        .buffered(inner.options.limits.fan_out.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// A list request's answer: its part, the upstream that answered, the
/// response, each question's choice in it, and the seconds it took.
type Answered = (Part, Probed, CompletionResponse, Vec<usize>, f64);

/// What the request carrying the first question and letters reports: the
/// cached count of its last prompt (vLLM's rule), that prompt's length,
/// its prompts, the upstream's unit of hits.
type FirstReport = (Option<usize>, usize, usize, usize);

/// Per question (of `n`), what the list requests answered: the letters'
/// log-probabilities found, the longest request's seconds, the upstream
/// that answered; and what the first request reports.
type Gathered = (
    Vec<HashMap<u32, f64>>,
    Vec<f64>,
    Vec<Option<Probed>>,
    Option<FirstReport>,
);

/// The list requests' answers gathered per question.
fn gather(
    all: Vec<Result<Answered, EngineError>>,
    n: usize,
    lead: bool,
    lengths: &[usize],
) -> Result<Gathered, EngineError> {
    let mut found: Vec<HashMap<u32, f64>> = vec![HashMap::new(); n];
    let mut seconds = vec![0.0f64; n];
    let mut probed_for = vec![None; n];
    let mut first = None;
    for r in all {
        let (part, probed, response, order, took) = r?;
        if part.questions.first() == Some(&0) && part.letters.start == 0 {
            let last = *part.questions.last().unwrap_or(&0);
            let count = cached_tokens(response.usage.as_ref());
            let prompts = part.questions.len() + usize::from(lead);
            first = Some((count, lengths[last], prompts, probed.hit_unit()));
        }
        for (&q, &c) in part.questions.iter().zip(&order) {
            let position = choice_position(&response.choices[c])
                .map_err(|m| EngineError::Upstream(m.to_string()))?;
            found[q].extend(position);
            seconds[q] = seconds[q].max(took);
            probed_for[q] = Some(probed.clone());
        }
    }
    Ok((found, seconds, probed_for, first))
}

/// A decision's questions on one state as list requests, all at once.
pub async fn score(inner: &Inner, request: &ScoreRequest) -> Result<ScoreResult, EngineError> {
    let key = request.state.0;
    let state = request.prefix.len();
    let started = Instant::now();
    let sent_before = inner.sent_states.sent_before(key);
    let prompts: Vec<Vec<u32>> = request
        .questions
        .iter()
        .map(|q| [request.prefix.as_slice(), q.suffix.as_slice()].concat())
        .collect();
    let lengths: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let limits = &inner.options.limits;
    let (groups, by_ids) = groups(inner, request);
    let suffixes: Vec<usize> = request.questions.iter().map(|q| q.suffix.len()).collect();
    let parts = parts(inner, &groups, by_ids, &lengths, &suffixes);
    // With several questions, each list opens with the state alone, so that
    // an upstream that keeps prompts (a decisio gateway) computes the state
    // as a decision does before any question continues it; vLLM's prefix
    // cache shares it among the list's prompts either way.
    let lead = request.questions.len() > 1 && state > 0;
    let send = |(i, (g, part)): (usize, (usize, Part))| {
        let letters = &groups[g].0;
        let list: Vec<Vec<u32>> = lead
            .then(|| request.prefix.clone())
            .into_iter()
            .chain(part.questions.iter().map(|&q| prompts[q].clone()))
            .collect();
        // What the upstream reads anew (`super::fair`): each question, and
        // the state in the first list of a state not sent before (its
        // prefix cache shares it with the others).
        let weight = part.questions.iter().map(|&q| suffixes[q]).sum::<usize>()
            + if i == 0 && !sent_before { state } else { 0 };
        async move {
            let sent = Instant::now();
            let (probed, response): (Probed, CompletionResponse) = inner
                .pool
                .call_routed(&key, "/v1/completions", score_timeout(inner), weight, |p| {
                    let named = match p.method {
                        LetterMethod::TokenIds => &letters[part.letters.clone()],
                        _ => &letters[..],
                    };
                    letter_request(
                        p.method,
                        CompletionRequest::greedy(&p.model, Prompt::list(list.clone()), 1),
                        named,
                    )
                })
                .await?;
            let mut order = by_prompt(&response, list.len()).map_err(EngineError::Upstream)?;
            if lead {
                order.remove(0);
            }
            let took = sent.elapsed().as_secs_f64();
            Ok::<_, EngineError>((part, probed, response, order, took))
        }
    };
    let requests = parts.len();
    let lists = futures::stream::iter(parts.into_iter().enumerate())
        .map(send)
        .buffer_unordered(limits.fan_out.max(1))
        .collect::<Vec<_>>();
    let hidden = hidden_states(inner, request, &prompts);
    let (all, hidden) = futures::future::join(lists, hidden).await;
    let hidden = hidden?;
    let (found, seconds, probed_for, first) = gather(all, prompts.len(), lead, &lengths)?;
    let reads = request.questions.iter().enumerate().map(|(i, q)| {
        let (found, probed, prompt) = (&found[i], probed_for[i].clone(), &prompts[i]);
        async move {
            let probed = probed.ok_or_else(|| {
                EngineError::Upstream("no list request carried the question".into())
            })?;
            letters_at(inner, &key, &probed, found, &q.read, || prompt.clone(), "").await
        }
    });
    let logprobs = futures::future::try_join_all(reads).await?;
    // A lone prompt's count is exact; a list's is its last prompt's, which
    // the list's earlier prompts may have cached just before it: believed
    // for a state this gateway sent before.
    let cached = first.is_some_and(|(count, last, n, unit)| {
        state_found(count, state, last, unit) && ((n == 1 && requests == 1) || sent_before)
    });
    let new_state_seconds = (!cached).then(|| started.elapsed().as_secs_f64());
    if let Some(s) = new_state_seconds {
        inner.options.metrics.new_state_seconds.observe(s);
    }
    Ok(ScoreResult {
        cached,
        new_state_seconds,
        questions: logprobs
            .into_iter()
            .zip(hidden)
            .zip(seconds)
            .map(|((lps, hidden), seconds)| QuestionScore {
                logits: lps.clone(),
                logprobs: lps,
                hidden,
                seconds,
                memoised: false,
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_hold_at_most_their_bounds_and_a_long_prompt_goes_alone() {
        let lengths = [10, 10, 10, 50, 10];
        let all = [0, 1, 2, 3, 4];
        assert_eq!(split(&all, &lengths, 100, 64), vec![vec![0, 1, 2, 3, 4]]);
        assert_eq!(
            split(&all, &lengths, 30, 64),
            vec![vec![0, 1, 2], vec![3], vec![4]]
        );
        assert_eq!(
            split(&all, &lengths, 100, 2),
            vec![vec![0, 1], vec![2, 3], vec![4]]
        );
    }

    #[test]
    fn a_state_is_remembered_once_sent() {
        let sent = SentStates::new(2);
        assert!(!sent.sent_before([1; 32]));
        assert!(sent.sent_before([1; 32]));
        assert!(!sent.sent_before([2; 32]));
        assert!(!sent.sent_before([3; 32]));
        // The oldest was forgotten.
        assert!(!sent.sent_before([1; 32]));
        assert!(sent.sent_before([3; 32]));
    }
}

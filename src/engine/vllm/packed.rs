//! Packed questions (`multi_question: "packed"`): one greedy completion of
//! a prompt holding every question, generating an answer sheet of one line
//! per question, `N: LETTER`; each answer's letters are read at its
//! position of that generation, or, where the sheet broke its format, by a
//! teacher-forced completion (`docs/design/vllm.md`, "Packed questions").

use std::collections::HashMap;
use std::time::Instant;

use futures::StreamExt;

use super::probe::Probed;
use super::protocol::{
    cached_tokens, letter_request, state_found, token_id, CompletionRequest, CompletionResponse,
};
use super::reading::{letters_at, read_letters};
use super::{secs, Inner, LetterMethod};
use crate::engine::{EngineError, PackedPrompt, QuestionScore, ScoreRequest, ScoreResult};

/// Where a packed answer's letters are read.
enum PackedRead {
    /// At this position of the generation, whose alternatives there are
    /// given by token id.
    Generated {
        position: usize,
        found: HashMap<u32, f64>,
    },
    /// From a teacher-forced prompt: the prompt, the well-formed part of
    /// the sheet and the question's marker.
    Fallback(Vec<u32>),
}

/// The answers' positions in a packed sheet: question `i`'s line (the
/// separator, then its marker; the first line is its marker alone, which
/// the route puts at the end of the prompt, so that it is empty here) must
/// follow the previous answer's letter exactly, and its letters are read
/// right after the marker. An answer whose generated token there is not one
/// of its letters is still read there, but ends the well-formed part of the
/// sheet: every later question, and every question whose line is not where
/// it belongs, falls back to a teacher-forced sheet, the well-formed part
/// followed by its own line. Returns, per question, the answer position
/// (`Ok`) or the fallback sheet (`Err`).
fn locate_answers(
    generated: &[u32],
    markers: &[Vec<u32>],
    separator: &[u32],
    reads: &[&[u32]],
) -> Vec<Result<usize, Vec<u32>>> {
    let mut out = Vec::with_capacity(markers.len());
    // The end of the well-formed part; `None` once it broke.
    let mut cursor = Some(0usize);
    let mut kept = 0usize;
    for (i, (marker, read)) in markers.iter().zip(reads).enumerate() {
        let line = || {
            let mut l = if i == 0 {
                Vec::new()
            } else {
                separator.to_vec()
            };
            l.extend_from_slice(marker);
            l
        };
        let position = cursor.and_then(|c| {
            let l = line();
            let end = c + l.len();
            (generated[c..].starts_with(&l) && end < generated.len()).then_some(end)
        });
        match position {
            Some(p) => {
                out.push(Ok(p));
                if read.contains(&generated[p]) {
                    cursor = Some(p + 1);
                    kept = p + 1;
                } else {
                    cursor = None;
                }
            }
            None => {
                cursor = None;
                let mut sheet = generated[..kept].to_vec();
                sheet.extend(line());
                out.push(Err(sheet));
            }
        }
    }
    out
}

/// The packed prompt a packed scoring job carries, one marker a question;
/// anything else is a fault of the route that sent it.
fn packed_prompt(request: &ScoreRequest) -> Result<&PackedPrompt, EngineError> {
    let packed: &PackedPrompt = request.packed.as_ref().ok_or_else(|| {
        EngineError::Model("a packed scoring job came without its packed prompt".into())
    })?;
    if request.hidden {
        return Err(EngineError::Model(
            "packed questions read option letters, not hidden states".into(),
        ));
    }
    if packed.markers.len() != request.questions.len() {
        return Err(EngineError::Model(format!(
            "a packed prompt of {} markers for {} questions",
            packed.markers.len(),
            request.questions.len()
        )));
    }
    Ok(packed)
}

/// Packed questions: the one prompt, one greedy generation of the answer
/// sheet with the letters' log-probabilities at every position, and each
/// answer's letters read at its own position (`docs/design/vllm.md`,
/// "Packed questions").
pub async fn score(inner: &Inner, request: &ScoreRequest) -> Result<ScoreResult, EngineError> {
    let packed = packed_prompt(request)?;
    let key = request.state.0;
    let started = Instant::now();
    // Every letter any question reads, once.
    let mut letters: Vec<u32> = Vec::new();
    for q in &request.questions {
        for id in &q.read {
            if !letters.contains(id) {
                letters.push(*id);
            }
        }
    }
    let timeout = secs(inner.options.limits.generate_timeout_s);
    let weight = packed.prompt.len() + packed.max_tokens;
    let (probed, response): (Probed, CompletionResponse) = inner
        .pool
        .call_routed(&key, "/v1/completions", timeout, weight, |p| {
            let base = CompletionRequest {
                // Always asked: the token names carry the generated ids.
                logprobs: Some(0),
                ..CompletionRequest::greedy(&p.model, packed.prompt.clone(), packed.max_tokens)
            };
            match p.method {
                // `allowed_token_ids` would constrain the sheet itself to
                // letters: the sheet is generated freely and each answer is
                // read by a teacher-forced request.
                LetterMethod::AllowedTokens => base,
                m => letter_request(m, base, &letters),
            }
        })
        .await?;
    let cached = state_found(
        cached_tokens(response.usage.as_ref()),
        request.prefix.len(),
        packed.prompt.len(),
        probed.hit_unit(),
    );
    let lp = response
        .choices
        .into_iter()
        .next()
        .and_then(|c| c.logprobs)
        .ok_or_else(|| EngineError::Upstream("the packed generation has no logprobs".into()))?;
    let generated = lp.token_ids().map_err(EngineError::Upstream)?;
    let reads: Vec<&[u32]> = request.questions.iter().map(|q| &q.read[..]).collect();
    let plans: Vec<PackedRead> =
        locate_answers(&generated, &packed.markers, &packed.separator, &reads)
            .into_iter()
            .map(|r| match r {
                Ok(position) => PackedRead::Generated {
                    position,
                    found: lp
                        .top_logprobs
                        .get(position)
                        .and_then(|m| m.as_ref())
                        .map(|m| {
                            m.iter()
                                .filter_map(|(n, &v)| token_id(n).map(|id| (id, v)))
                                .collect()
                        })
                        .unwrap_or_default(),
                },
                Err(sheet) => {
                    let mut prompt = packed.prompt.clone();
                    prompt.extend(sheet);
                    PackedRead::Fallback(prompt)
                }
            })
            .collect();
    let metrics = &inner.options.metrics;
    let mut reads = Vec::with_capacity(plans.len());
    for (plan, q) in plans.into_iter().zip(&request.questions) {
        let label = match plan {
            PackedRead::Generated { .. } => "generated",
            PackedRead::Fallback(_) => "fallback",
        };
        metrics.packed_answers.with_label_values(&[label]).inc();
        reads.push(read_packed(
            inner, &key, &probed, packed, &generated, plan, &q.read,
        ));
    }
    let values: Vec<Vec<f32>> = futures::stream::iter(reads)
        .buffered(inner.options.limits.fan_out.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let seconds = started.elapsed().as_secs_f64();
    let new_state_seconds = (!cached).then_some(seconds);
    if let Some(s) = new_state_seconds {
        metrics.new_state_seconds.observe(s);
    }
    let each = seconds / values.len().max(1) as f64;
    Ok(ScoreResult {
        cached,
        new_state_seconds,
        questions: values
            .into_iter()
            .map(|lps| QuestionScore {
                logits: lps.clone(),
                logprobs: lps,
                hidden: None,
                seconds: each,
                memoised: false,
            })
            .collect(),
    })
}

/// One packed answer's letters, where [`locate_answers`] found them.
async fn read_packed(
    inner: &Inner,
    key: &[u8],
    probed: &Probed,
    packed: &PackedPrompt,
    generated: &[u32],
    plan: PackedRead,
    read: &[u32],
) -> Result<Vec<f32>, EngineError> {
    let (position, found) = match plan {
        PackedRead::Fallback(prompt) => {
            return Ok(read_letters(inner, key, &prompt, read, 0).await?.0)
        }
        PackedRead::Generated { position, found } => (position, found),
    };
    // The prompt as the answer position saw it, for the reads that need a
    // request of their own.
    let teacher = || {
        let mut p = packed.prompt.clone();
        p.extend_from_slice(&generated[..position]);
        p
    };
    if probed.method == LetterMethod::AllowedTokens {
        return Ok(read_letters(inner, key, &teacher(), read, 0).await?.0);
    }
    let at = format!(" at packed answer position {position}");
    letters_at(inner, key, probed, &found, read, teacher, &at).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_answers_are_found_after_their_markers() {
        // Markers `1:` = [10, 11], `2:` = [20, 11], `3:` = [30, 11], the
        // separator `\n` = [12]; letters 1..4.
        let markers = vec![vec![10, 11], vec![20, 11], vec![30, 11]];
        let sep = [12];
        let letters: &[u32] = &[1, 2, 3, 4];
        let reads = [letters, letters, letters];
        let sheet = [10, 11, 2, 12, 20, 11, 4, 12, 30, 11, 1, 0];
        assert_eq!(
            locate_answers(&sheet, &markers, &sep, &reads),
            vec![Ok(2), Ok(6), Ok(10)]
        );
        // The second line breaks the format: it and the third are read
        // after the first answer followed by their own lines.
        let sheet = [10, 11, 2, 12, 99, 11, 4, 12, 30, 11, 1];
        assert_eq!(
            locate_answers(&sheet, &markers, &sep, &reads),
            vec![
                Ok(2),
                Err(vec![10, 11, 2, 12, 20, 11]),
                Err(vec![10, 11, 2, 12, 30, 11])
            ]
        );
        // A non-letter answer is read where it stands and ends the
        // well-formed part (here empty); a sheet cut short falls back.
        let sheet = [10, 11, 77, 12, 20, 11, 4];
        assert_eq!(
            locate_answers(&sheet, &markers, &sep, &reads),
            vec![Ok(2), Err(vec![12, 20, 11]), Err(vec![12, 30, 11])]
        );
        assert_eq!(
            locate_answers(&[10, 11], &markers[..1], &sep, &reads[..1]),
            vec![Err(vec![10, 11])]
        );
        // The first marker at the end of the prompt: the first answer is
        // the first generated token.
        let prompted = vec![vec![], vec![20, 11]];
        assert_eq!(
            locate_answers(&[3, 12, 20, 11, 1], &prompted, &sep, &reads[..2]),
            vec![Ok(0), Ok(4)]
        );
    }
}

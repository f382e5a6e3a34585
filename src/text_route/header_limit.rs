//! A header that does not outgrow the context (`--header-limit`), as the
//! reference decisio 0.35.0 plans it (`decisio/serve/header_limit.py`,
//! `vllm_engine.header_plan`).
//!
//! Under the header layout every row of a System One request lists the
//! instructions of all its questions before the state. A request of many
//! questions with long instructions can render a row over the prompt
//! ceiling that the plain layout would fit. The header then lists as many
//! of the instruction lines as fit, in the request's order (a prefix, so
//! two limits nest), and none where not even one does: the row is then the
//! plain layout's, exactly. A request whose rows fit is not touched.

use serde::Serialize;

use super::decide::{render_wire_user_turn, Question, State};
use super::over_limit::grouped;
use super::systemone::{layout_header, Layout, QUESTIONS_HEAD};
use super::{RouteError, TextRoute};
use crate::settings::HeaderLimit;
use crate::text_route::decide::PadPolicy;

/// What the header limit did to a request (the response's
/// `x_header_limited`, the reference's `header_limited`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeaderLimited {
    /// `header`, or `plain` where no line was listed.
    pub layout: &'static str,
    /// The instruction lines listed, of the request's questions.
    pub listed: usize,
    pub of: usize,
    /// The header's tokens as listed, and with every line.
    pub header_tokens: usize,
    pub of_header_tokens: usize,
    /// The prompt ceiling, and the tokens the header could take.
    pub row_limit: usize,
    pub allowed_tokens: usize,
    /// `context` (a row would be over the ceiling) or `cap` (the header
    /// over `--header-limit N`).
    pub reason: &'static str,
}

impl HeaderLimited {
    /// The `x-decisio-layout` header: `header; listed=12; of=32; reason=context`.
    pub fn header_value(&self) -> String {
        format!(
            "{}; listed={}; of={}; reason={}",
            self.layout, self.listed, self.of, self.reason
        )
    }
}

/// What the plan measures of a request, besides its rows.
pub struct Request<'a> {
    /// Each question's instructions, as the header lists them.
    pub instructions: Vec<&'a str>,
    /// The state's text.
    pub state: &'a str,
    /// Each question's own text.
    pub questions: Vec<String>,
    /// The tokens of an empty user turn (the template and system turn).
    pub template_tokens: usize,
}

/// The largest `k` such that the heading and the first `k` lines take at
/// most `allowed` tokens: the first lines, never a pick of the shorter.
pub fn choose_lines(line_tokens: &[usize], head_tokens: usize, allowed: usize) -> usize {
    let mut used = head_tokens;
    let mut k = 0;
    for &t in line_tokens {
        if used + t > allowed {
            break;
        }
        used += t;
        k += 1;
    }
    k
}

/// The header limit's plan of a request under the header layout: `None`
/// where nothing is over (the request untouched), the report where the
/// header lists fewer lines, an error (the reference's words) where not
/// even the plain row fits, or where the limit is off and the header's row
/// is over. `count` tokenizes without special tokens; `longest(k)` is the
/// request's longest row with its header listing the first `k` lines.
pub fn plan(
    count: &dyn Fn(&str) -> Result<usize, String>,
    longest: &dyn Fn(usize) -> Result<usize, String>,
    request: &Request,
    limit: usize,
    reserve: usize,
    setting: HeaderLimit,
) -> Result<Option<HeaderLimited>, String> {
    let (off, cap) = match setting {
        HeaderLimit::Off => (true, None),
        HeaderLimit::Auto(cap) => (false, cap),
    };
    let n = request.instructions.len();
    let full = layout_header(request.instructions.iter().copied());
    // A token is at least a byte: a request whose bytes fit needs no plan.
    let raw = full.len()
        + request.state.len()
        + request.questions.iter().map(String::len).max().unwrap_or(0)
        + 2048;
    if raw + reserve <= limit && cap.is_none_or(|c| full.len() <= c) {
        return Ok(None);
    }
    let full_rows = longest(n)?;
    let full_header = count(&full)?;
    let plain = longest(0)?;
    let mut question = 0;
    for q in &request.questions {
        question = question.max(count(q)?);
    }
    let pieces = Pieces {
        header: full_header,
        state: count(request.state)?,
        question,
        template: request.template_tokens,
        row: full_rows,
    };
    let over_context = full_rows + reserve > limit;
    let over_cap = cap.is_some_and(|c| full_header > c);
    if !over_context && !over_cap {
        return Ok(None);
    }
    if off {
        return match over_context {
            true => Err(refusal(limit, &pieces, true)),
            false => Ok(None),
        };
    }
    if plain + reserve > limit {
        let plain_pieces = Pieces {
            header: 0,
            row: plain,
            ..pieces
        };
        return Err(refusal(limit, &plain_pieces, false));
    }
    let mut allowed = limit - reserve - plain;
    if let Some(c) = cap {
        allowed = allowed.min(c);
    }
    let head = count(QUESTIONS_HEAD)? + count("\n")?;
    let mut lines = Vec::with_capacity(n);
    for text in &request.instructions {
        lines.push(count(&format!("- {text}\n"))?);
    }
    let mut k = choose_lines(&lines, head, allowed);
    let header_tokens = |j: usize| match j {
        0 => Ok(0),
        j => count(&layout_header(request.instructions[..j].iter().copied())),
    };
    // The lines' own counts are within a token or two of the header's: the
    // header's exact count decides, then the rows themselves.
    while k < n && header_tokens(k + 1)? <= allowed {
        k += 1;
    }
    while k > 0 && header_tokens(k)? > allowed {
        k -= 1;
    }
    while k > 0 && longest(k)? + reserve > limit {
        k -= 1;
    }
    Ok(Some(HeaderLimited {
        layout: if k > 0 { "header" } else { "plain" },
        listed: k,
        of: n,
        header_tokens: header_tokens(k)?,
        of_header_tokens: full_header,
        row_limit: limit,
        allowed_tokens: allowed,
        reason: if over_context { "context" } else { "cap" },
    }))
}

/// The longest row's tokens by piece, for a refusal.
struct Pieces {
    header: usize,
    state: usize,
    question: usize,
    template: usize,
    row: usize,
}

/// The refusal of a row over the ceiling that no header limit brings
/// under: where its tokens are and the ways out (the reference's words).
fn refusal(limit: usize, p: &Pieces, header_off: bool) -> String {
    let mut parts = vec![
        format!("the state {}", grouped(p.state)),
        format!("the longest question {}", grouped(p.question)),
    ];
    if p.header > 0 {
        parts.insert(0, format!("the header {}", grouped(p.header)));
    }
    let head = format!(
        "the longest row of the request is {} tokens ({}, the template and system turn {}) \
         against the {} the server answers",
        grouped(p.row),
        parts.join(", "),
        grouped(p.template),
        grouped(limit)
    );
    let mut ways = Vec::new();
    if header_off && p.header > 0 {
        ways.push(
            "start the server with --header-limit auto, which lists only the questions that fit",
        );
    }
    ways.push("send \"over_limit\": \"truncate\" to cut the state to its start");
    ways.push("shorten the state or the question");
    ways.push("or start the server with a longer --max-model-len (up to the base's ceiling)");
    let last = ways.pop().unwrap_or_default();
    format!("{head}; {}, {last}", ways.join(", "))
}

impl TextRoute {
    /// The header limit's plan of a System One request (`questions` as
    /// planned, on the state's text), under this server's
    /// `--header-limit`, ceiling and padding; `None` outside the header
    /// layout and where nothing is over. A row that cannot be answered is
    /// refused (413-class, the reference's words).
    pub fn header_plan(
        &self,
        state: &str,
        questions: &[Question],
    ) -> Result<Option<HeaderLimited>, RouteError> {
        let wire = questions.first().is_some_and(|q| q.wire.is_some());
        if !wire || self.wire.format.layout != Layout::Header {
            return Ok(None);
        }
        let count = |t: &str| self.count_tokens(t).map_err(|e| e.to_string());
        let instructions: Vec<&str> = questions.iter().map(|q| q.text.trim()).collect();
        let longest = |k: usize| -> Result<usize, String> {
            let header = match k {
                0 => String::new(),
                k => layout_header(instructions[..k].iter().copied()),
            };
            let listed = State::Text(format!("{header}{state}"));
            let mut most = 0;
            for q in questions {
                let text = self.render_whole(&listed, q).map_err(|e| e.to_string())?;
                most = most.max(count(&text)?);
            }
            Ok(most)
        };
        let mut texts = Vec::with_capacity(questions.len());
        for q in questions {
            texts.push(self.wire_question_text(q)?);
        }
        let turn = render_wire_user_turn(&self.template, "", &self.wire.format)?;
        let request = Request {
            instructions: instructions.clone(),
            state,
            questions: texts,
            template_tokens: self.count_tokens(&turn)?,
        };
        let reserve = match self.padding {
            PadPolicy::Block(block) => block,
            PadPolicy::None => 0,
        };
        let setting = self.limits.header_limit;
        plan(
            &count,
            &longest,
            &request,
            self.prompt_limit(),
            reserve,
            setting,
        )
        .map_err(|message| RouteError::ContextLength {
            message,
            param: "state",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_lines_that_fit_are_chosen() {
        assert_eq!(choose_lines(&[5, 5, 5], 3, 13), 2);
        assert_eq!(choose_lines(&[5, 1, 1], 3, 7), 0);
        assert_eq!(
            choose_lines(&[5, 30, 1], 3, 20),
            1,
            "a prefix, not the shorter lines"
        );
    }

    #[test]
    fn settings_parse_as_the_reference_writes_them() {
        assert_eq!(HeaderLimit::parse("auto"), Ok(HeaderLimit::Auto(None)));
        assert_eq!(HeaderLimit::parse(" OFF "), Ok(HeaderLimit::Off));
        assert_eq!(HeaderLimit::parse("200"), Ok(HeaderLimit::Auto(Some(200))));
        assert!(HeaderLimit::parse("0").is_err());
        assert!(HeaderLimit::parse("some").is_err());
        assert_eq!(HeaderLimit::Auto(Some(64)).describe(), "64");
    }
}

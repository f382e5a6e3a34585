//! What chat and completions share on the way out: a generation's outputs
//! as server-sent events (`stream: true`), or read to the end for an answer
//! sent whole, and the token counts both report.

use actix_web::web::Bytes;
use actix_web::HttpResponse;
use serde::Serialize;

use super::error::ApiError;
use crate::text_route::{GenerationStream, Output, TokenOutput};

#[derive(Clone, Debug, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// One server-sent event.
pub fn sse<T: Serialize>(value: &T) -> Bytes {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "{}".into());
    Bytes::from(format!("data: {json}\n\n"))
}

const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

/// Streams `chunks` built from the route's outputs as server-sent events,
/// closing with `[DONE]`; an error mid-stream is sent as an error event.
pub fn event_stream<S, F>(stream: GenerationStream, state: S, on_output: F) -> HttpResponse
where
    S: 'static,
    F: FnMut(&mut S, Output) -> Vec<Bytes> + 'static,
{
    struct Feed<S, F> {
        stream: GenerationStream,
        state: S,
        on_output: F,
        finished: bool,
    }
    let feed = Feed {
        stream,
        state,
        on_output,
        finished: false,
    };
    let body = futures::stream::unfold(feed, |mut feed| async move {
        if feed.finished {
            return None;
        }
        let bytes = match feed.stream.next().await {
            Some(Ok(output)) => (feed.on_output)(&mut feed.state, output).concat(),
            Some(Err(e)) => {
                feed.finished = true;
                let mut b = sse(&ApiError::from(e).body()).to_vec();
                b.extend_from_slice(SSE_DONE);
                b
            }
            None => {
                feed.finished = true;
                SSE_DONE.to_vec()
            }
        };
        Some((Ok::<_, actix_web::Error>(Bytes::from(bytes)), feed))
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .streaming(body)
}

/// A generation read to its end, for an answer sent whole.
pub struct Collected {
    /// The generated text.
    pub text: String,
    pub finish_reason: &'static str,
    pub usage: Usage,
}

/// Reads `stream` to its end, handing every token with log-probabilities
/// to `on_tokens` as it comes (the prompt's, when asked for, then the
/// generated ones).
pub async fn collect(
    mut stream: GenerationStream,
    mut on_tokens: impl FnMut(&[TokenOutput]),
) -> Result<Collected, ApiError> {
    let mut text = String::new();
    loop {
        match stream.next().await {
            Some(Ok(Output::Prompt(tokens))) => on_tokens(&tokens),
            Some(Ok(Output::Delta {
                text: delta,
                tokens,
            })) => {
                text.push_str(&delta);
                on_tokens(&tokens);
            }
            Some(Ok(Output::Done {
                finish_reason,
                prompt_tokens,
                completion_tokens,
            })) => {
                return Ok(Collected {
                    text,
                    finish_reason: finish_reason.as_str(),
                    usage: Usage::new(prompt_tokens, completion_tokens),
                })
            }
            Some(Err(e)) => return Err(e.into()),
            None => {
                return Err(ApiError::Internal(
                    "the generation ended without a result".into(),
                ))
            }
        }
    }
}

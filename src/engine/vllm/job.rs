//! How the vLLM backend runs one job on its runtime: until its work ends,
//! its client leaves, or its work panics, whichever comes first.

use futures::FutureExt;

use crate::engine::EngineError;
use crate::metrics::Metrics;

/// A job's work, run until it ends or its client leaves (`left` resolves
/// when the client's end of the job's channel is dropped, as the HTTP layer
/// drops it when the connection closes). A job left is dropped at once:
/// its upstream connections close, and vLLM aborts each request whose
/// connection closed, so nobody's work is left running upstream. `None`
/// when the client left first. Work that panics fails alone: its client
/// gets the server's fault (500) once, the panic is logged, and the
/// runtime serves on.
pub async fn unless_left<T>(
    metrics: &Metrics,
    work: impl std::future::Future<Output = Result<T, EngineError>>,
    left: impl std::future::Future<Output = ()>,
) -> Option<Result<T, EngineError>> {
    let work = std::panic::AssertUnwindSafe(work).catch_unwind();
    tokio::select! {
        biased;
        done = work => Some(done.unwrap_or_else(|panic| Err(crate::engine::panicked(&*panic)))),
        () = left => {
            metrics.abandoned_jobs.inc();
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T>(
        metrics: &Metrics,
        work: impl std::future::Future<Output = Result<T, EngineError>>,
        leave: bool,
    ) -> Option<Result<T, EngineError>> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let left = async {
                if !leave {
                    std::future::pending::<()>().await;
                }
            };
            unless_left(metrics, work, left).await
        })
    }

    #[test]
    fn a_job_ends_by_its_work_its_client_leaving_or_its_panic() {
        let metrics = Metrics::new();
        assert!(matches!(run(&metrics, async { Ok(7) }, false), Some(Ok(7))));
        assert_eq!(metrics.abandoned_jobs.get(), 0);
        // Work that never ends is dropped when its client leaves.
        let never = std::future::pending::<Result<(), EngineError>>();
        assert!(run(&metrics, never, true).is_none());
        assert_eq!(metrics.abandoned_jobs.get(), 1);
        // A panic is the server's fault, answered once; the runtime and
        // the caller go on.
        let panics = async {
            if metrics.abandoned_jobs.get() < 100 {
                panic!("a fault of the vLLM backend's work");
            }
            Ok(())
        };
        match run(&metrics, panics, false) {
            Some(Err(EngineError::Model(m))) => {
                assert!(m.contains("a fault of the vLLM backend's work"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(run(&metrics, async { Ok(8) }, false), Some(Ok(8))));
    }
}

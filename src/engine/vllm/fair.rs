//! Fair shares of the upstreams: a job's calls take turns with other
//! jobs' (`docs/limits.md`, "Fair scheduling").
//!
//! An upstream serves the calls it holds in arrival order, so a job that
//! sent many calls at once (256 questions of 255 options, in list
//! requests) would hold every later job behind all of them. The gateway
//! keeps the work in flight to a pool's upstreams within a budget of
//! prompt tokens: `--fair-seconds` of the tokens the upstreams were
//! measured to read a second while busy, and never under `--fair-tokens`
//! per upstream. Each call weighs the tokens it asks the upstream to read
//! (a list request: its state once and each question); a call that does
//! not fit waits, and room freed goes to the waiting call whose job has
//! been served the fewest tokens so far (the earliest among equals): a
//! small request goes before the rest of a large one, and two large ones
//! alternate. A call heavier than the whole budget runs alone, so a job's
//! list requests and echoes are cut to the budget ([`Gate::budget`]). A
//! job alone uses the whole budget; beside others, a new one waits about
//! `--fair-seconds` for the work already in flight, whatever another sent
//! before it.
//!
//! A job is what the engine seam was given (a decision, a generation, an
//! embeddings request): [`JOB`] carries its [`Share`] to the calls its
//! work makes. Calls made outside any job (probes, health checks) are not
//! gated.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::oneshot;

tokio::task_local! {
    /// The share of the job whose work makes the calls (see [`Gate`]).
    pub static JOB: Arc<Share>;
}

/// What one job was served: tokens let in so far.
#[derive(Default)]
pub struct Share {
    served: AtomicUsize,
}

/// A new job's share.
pub fn new_job() -> Arc<Share> {
    Arc::new(Share::default())
}

/// Seconds of busy time over which the measured rate is averaged.
const RATE_WINDOW_S: f64 = 30.0;

/// The token budget of one pool's upstreams, shared fairly between jobs.
pub struct Gate {
    /// Seconds of the measured throughput kept in flight; 0: not gated.
    seconds: f64,
    /// The least budget, in tokens.
    floor: usize,
    state: Mutex<State>,
}

/// A call waiting for room.
struct Waiter {
    share: Arc<Share>,
    arrival: u64,
    weight: usize,
    wake: oneshot::Sender<()>,
}

#[derive(Default)]
struct State {
    /// Tokens in flight.
    busy: usize,
    waiting: Vec<Waiter>,
    arrivals: u64,
    /// How fast the upstreams read: tokens done and seconds busy, each
    /// decayed so that the last half minute of busy time counts most.
    tokens_done: f64,
    busy_s: f64,
    /// Since when the busy time was last counted (`None`: idle).
    since: Option<Instant>,
}

impl State {
    /// The budget now: `seconds` of the measured rate, at least `floor`.
    fn budget(&self, seconds: f64, floor: usize) -> usize {
        if self.busy_s <= 0.0 {
            return floor;
        }
        ((self.tokens_done / self.busy_s * seconds) as usize).max(floor)
    }

    fn fits(&self, weight: usize, budget: usize) -> bool {
        self.busy == 0 || self.busy + weight <= budget
    }

    fn take(&mut self, share: &Share, weight: usize) {
        if self.busy == 0 {
            self.since = Some(Instant::now());
        }
        self.busy += weight;
        share.served.fetch_add(weight, Ordering::Relaxed);
    }

    /// `weight` tokens given back; counted as read into the rate, with
    /// the busy time since the last count, when the call was answered.
    fn give_back(&mut self, weight: usize, read: bool) {
        let now = Instant::now();
        if let (Some(since), true) = (self.since, read) {
            let dt = now.duration_since(since).as_secs_f64();
            let keep = (-dt / RATE_WINDOW_S).exp();
            self.tokens_done = self.tokens_done * keep + weight as f64;
            self.busy_s = self.busy_s * keep + dt;
        }
        self.busy = self.busy.saturating_sub(weight);
        self.since = (self.busy > 0).then_some(now);
    }

    /// Lets waiting calls in while they fit, the call of the job served
    /// the least first; a call that does not fit yet holds the others
    /// back, so a heavy call is not passed for ever.
    fn hand_on(&mut self, seconds: f64, floor: usize) {
        let budget = self.budget(seconds, floor);
        while !self.waiting.is_empty() {
            let next = (0..self.waiting.len())
                .min_by_key(|&i| {
                    let w = &self.waiting[i];
                    (w.share.served.load(Ordering::Relaxed), w.arrival)
                })
                .unwrap_or(0);
            if !self.fits(self.waiting[next].weight, budget) {
                return;
            }
            let w = self.waiting.swap_remove(next);
            // A call that stopped waiting (its job left) takes nothing.
            if w.wake.send(()).is_ok() {
                self.take(&w.share, w.weight);
            }
        }
    }
}

/// Room held for one call; given back when dropped.
pub struct Permit {
    gate: Arc<Gate>,
    weight: usize,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.give_back(self.weight, true);
    }
}

/// A call waiting; if dropped once let in but before it saw so, the room
/// goes on to the next.
struct Waiting {
    gate: Arc<Gate>,
    weight: usize,
    arrival: u64,
    seen: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.seen {
            return;
        }
        let let_in = {
            let mut s = self.gate.lock();
            let before = s.waiting.len();
            s.waiting.retain(|w| w.arrival != self.arrival);
            s.waiting.len() == before
        };
        if let_in {
            self.gate.give_back(self.weight, false);
        }
    }
}

impl Gate {
    /// A gate keeping `seconds` of the measured throughput in flight, and
    /// never less than `floor` tokens (`seconds` 0: none kept back).
    pub fn new(seconds: f64, floor: usize) -> Arc<Self> {
        Arc::new(Gate {
            seconds,
            floor: floor.max(1),
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn give_back(&self, weight: usize, read: bool) {
        let mut s = self.lock();
        s.give_back(weight, read);
        s.hand_on(self.seconds, self.floor);
    }

    /// The most tokens one call may weigh and still run beside others;
    /// `None` when nothing is kept back.
    pub fn budget(&self) -> Option<usize> {
        (self.seconds > 0.0).then(|| self.lock().budget(self.seconds, self.floor))
    }

    /// Room for a call of the current job that asks the upstream to read
    /// `weight` tokens; `None` outside any job, or when nothing is gated.
    pub async fn enter(self: &Arc<Self>, weight: usize) -> Option<Permit> {
        let share = JOB.try_with(Arc::clone).ok()?;
        if self.seconds <= 0.0 {
            return None;
        }
        let weight = weight.max(1);
        let (rx, arrival) = {
            let mut s = self.lock();
            if s.waiting.is_empty() && s.fits(weight, s.budget(self.seconds, self.floor)) {
                s.take(&share, weight);
                return Some(Permit {
                    gate: self.clone(),
                    weight,
                });
            }
            s.arrivals += 1;
            let (wake, rx) = oneshot::channel();
            let arrival = s.arrivals;
            s.waiting.push(Waiter {
                share,
                arrival,
                weight,
                wake,
            });
            // It may go before those waiting: its job may be served less.
            s.hand_on(self.seconds, self.floor);
            (rx, arrival)
        };
        let mut waiting = Waiting {
            gate: self.clone(),
            weight,
            arrival,
            seen: false,
        };
        // The sender stays in the queue until the call is let in, or the
        // call stops waiting and takes it out.
        let _ = rx.await;
        waiting.seen = true;
        Some(Permit {
            gate: self.clone(),
            weight,
        })
    }

    /// Tokens in flight now, and calls waiting.
    #[cfg(test)]
    fn load(&self) -> (usize, usize) {
        let s = self.lock();
        (s.busy, s.waiting.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A gate whose budget stays at `floor` tokens.
    fn fixed(floor: usize) -> Arc<Gate> {
        Gate::new(1e-9, floor)
    }

    #[test]
    fn freed_room_goes_to_the_job_served_least() {
        rt().block_on(async {
            let gate = fixed(100);
            let (one, two) = (new_job(), new_job());
            // Job 1 fills the budget and queues two more calls.
            let a = JOB.scope(one.clone(), gate.enter(60)).await.unwrap();
            let b = JOB.scope(one.clone(), gate.enter(40)).await.unwrap();
            let order = Arc::new(Mutex::new(Vec::new()));
            let call = |job: &Arc<Share>, n: u32, weight: usize| {
                let (gate, order) = (gate.clone(), order.clone());
                tokio::spawn(JOB.scope(job.clone(), async move {
                    let p = gate.enter(weight).await.unwrap();
                    order.lock().unwrap().push(n);
                    tokio::task::yield_now().await;
                    drop(p);
                }))
            };
            let heavy = [call(&one, 1, 60), call(&one, 1, 60)];
            tokio::task::yield_now().await;
            // Job 2 comes after job 1's waiting calls.
            let small = call(&two, 2, 10);
            tokio::task::yield_now().await;
            assert_eq!(gate.load(), (100, 3));
            drop(a);
            // The room freed goes to job 2, served nothing, before job 1's.
            small.await.unwrap();
            drop(b);
            for h in heavy {
                h.await.unwrap();
            }
            assert_eq!(*order.lock().unwrap(), vec![2, 1, 1]);
            assert_eq!(gate.load(), (0, 0));
            // A call over the whole budget runs alone.
            let over = JOB.scope(new_job(), gate.enter(1000)).await.unwrap();
            assert_eq!(gate.load(), (1000, 0));
            drop(over);
        });
    }

    #[test]
    fn a_light_job_passes_a_heavy_call_that_does_not_fit() {
        rt().block_on(async {
            let gate = fixed(100);
            let one = new_job();
            let a = JOB.scope(one.clone(), gate.enter(70)).await.unwrap();
            let heavy = tokio::spawn(JOB.scope(one.clone(), {
                let gate = gate.clone();
                async move { gate.enter(70).await.map(drop) }
            }));
            tokio::task::yield_now().await;
            assert_eq!(gate.load(), (70, 1));
            // Job 2 was served nothing, and its call fits: it goes at once.
            let b = JOB.scope(new_job(), gate.enter(20)).await.unwrap();
            assert_eq!(gate.load(), (90, 1));
            drop((a, b));
            heavy.await.unwrap();
            assert_eq!(gate.load(), (0, 0));
        });
    }

    #[test]
    fn the_budget_follows_the_measured_throughput() {
        rt().block_on(async {
            let gate = Gate::new(1.0, 10);
            assert_eq!(gate.budget(), Some(10));
            let p = JOB.scope(new_job(), gate.enter(1000)).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            drop(p);
            // 1,000 tokens in 50 ms or more: at most 20,000 a second.
            let b = gate.budget().unwrap();
            assert!(b > 10 && b <= 20_000, "{b}");
            assert_eq!(Gate::new(0.0, 10).budget(), None);
        });
    }

    #[test]
    fn a_call_that_stops_waiting_takes_no_room() {
        rt().block_on(async {
            let gate = fixed(10);
            let a = JOB.scope(new_job(), gate.enter(10)).await.unwrap();
            let left = tokio::spawn(JOB.scope(new_job(), {
                let gate = gate.clone();
                async move { gate.enter(5).await.map(drop) }
            }));
            tokio::task::yield_now().await;
            assert_eq!(gate.load(), (10, 1));
            left.abort();
            let _ = left.await;
            assert_eq!(gate.load(), (10, 0));
            drop(a);
            assert_eq!(gate.load(), (0, 0));
            // Outside any job, or with no budget, nothing is gated.
            assert!(gate.enter(5).await.is_none());
            assert!(JOB
                .scope(new_job(), Gate::new(0.0, 5).enter(5))
                .await
                .is_none());
        });
    }
}

//! Where selectors are parsed and run: a thread of their own, never an async worker, so a slow
//! evaluation cannot hold up the heartbeat or another request. A caller waits at most its budget;
//! work that overruns it is left to finish on its thread, which is then retired so that the next
//! job gets a fresh one. The thread's stack is large: the parser recurses per level of nesting
//! (several frames per parenthesis), and a stack overflow aborts the whole process.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cel::{Context, Env, Program, Value};

use crate::model::StorageSnapshot;

/// What an evaluation gave, in terms that cross threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    Bool(bool),
    /// Anything else, described for the message ("the string \"x\"").
    Other(String),
    /// CEL's runtime error.
    Failed(String),
}

/// Why the parse refused a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Refusal {
    Syntax(String),
    NotAllowed(String),
}

/// Work for the thread, answering on a channel of its own.
type Job = Box<dyn FnOnce(&Arc<Env>) + Send>;

/// The evaluator thread's stack: reserved, not committed, so it costs what the deepest parse
/// touches. A selector of `MAX_LEN` characters nests at most a few hundred levels.
const STACK: usize = 256 << 20;

/// The thread evaluating now, with its generation (so that only one waiter retires it).
static WORKER: Mutex<Option<(u64, Sender<Job>)>> = Mutex::new(None);

/// Evaluates `program` for `storage`, or `None` when that takes longer than `budget`.
pub(super) fn run(
    program: Arc<Program>,
    storage: StorageSnapshot,
    node: String,
    budget: Duration,
) -> Option<Outcome> {
    let failed = |why: &str| Outcome::Failed(format!("the CEL evaluator failed{why}"));
    let work = move |env: &Arc<Env>| evaluate(env, &program, &storage, node);
    submit(work, budget, failed(" on it"), || failed(""))
}

/// Parses `source` and checks it against the grammar, or `None` when that takes longer than
/// `budget`.
pub(super) fn parse(source: Arc<str>, budget: Duration) -> Option<Result<Program, Refusal>> {
    let unreadable = || Err(Refusal::Syntax("the CEL parser cannot read it".to_string()));
    submit(move |_| compile(&source), budget, unreadable(), unreadable)
}

/// Hands `work` to the thread and waits up to `budget` for its answer; `panicked` is the answer
/// when the work panics, `lost` when the thread went away without one.
fn submit<T: Send + 'static>(
    work: impl FnOnce(&Arc<Env>) -> T + Send + 'static,
    budget: Duration,
    panicked: T,
    lost: impl FnOnce() -> T,
) -> Option<T> {
    let (reply, answer) = mpsc::sync_channel(1);
    // Every answer is sent even when the caller stopped waiting: a failed send is no matter.
    let job: Job = Box::new(move |env| {
        let _ = reply.send(catch_unwind(AssertUnwindSafe(|| work(env))).unwrap_or(panicked));
    });
    // The send fails only when no thread could be started: the answer is then `lost`.
    let (generation, jobs) = worker();
    let _ = jobs.send(job);
    match answer.recv_timeout(budget) {
        Ok(outcome) => Some(outcome),
        Err(RecvTimeoutError::Timeout) => {
            // The thread is let go: it ends once it has drained what it was given.
            lock().take_if(|(g, _)| *g == generation);
            None
        }
        Err(RecvTimeoutError::Disconnected) => Some(lost()),
    }
}

fn lock() -> std::sync::MutexGuard<'static, Option<(u64, Sender<Job>)>> {
    WORKER.lock().unwrap_or_else(|p| p.into_inner())
}

fn worker() -> (u64, Sender<Job>) {
    let mut slot = lock();
    if let Some(worker) = slot.as_ref() {
        return worker.clone();
    }
    static GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let generation = GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (jobs, queue) = mpsc::channel::<Job>();
    let spawned = std::thread::Builder::new()
        .name("cel-selectors".into())
        .stack_size(STACK)
        .spawn(move || serve(queue));
    if spawned.is_ok() {
        *slot = Some((generation, jobs.clone()));
    }
    // Without a thread the queue is dropped and the send fails: the caller reports a failure.
    (generation, jobs)
}

fn serve(queue: mpsc::Receiver<Job>) {
    let env = Arc::new(Env::stdlib());
    while let Ok(job) = queue.recv() {
        job(&env);
    }
}

/// Parses and checks `source`. The parser's own message quotes the source line with a marker
/// under the column, and panics formatting it past column 65,535: the message is made here from
/// the position and the reason alone.
fn compile(source: &str) -> Result<Program, Refusal> {
    let program = Program::compile(source).map_err(|errors| {
        let reasons: Vec<String> = errors
            .errors
            .iter()
            .take(3)
            .map(|e| format!("at line {}, column {}: {}", e.pos.0, e.pos.1 + 1, e.msg))
            .collect();
        Refusal::Syntax(reasons.join("; "))
    })?;
    super::grammar::walk(program.expression(), 0).map_err(Refusal::NotAllowed)?;
    Ok(program)
}

/// Runs `program` with the variables a selector sees of `storage` on `node` (the Go provider's
/// names).
fn evaluate(env: &Arc<Env>, program: &Program, storage: &StorageSnapshot, node: String) -> Outcome {
    let mut context = Context::with_env(env.clone());
    context.add_variable_from_value("name", storage.name.to_string());
    context.add_variable_from_value("node", node);
    context.add_variable_from_value("storageType", storage.storage_type.clone());
    context.add_variable_from_value("availableSpace", Value::UInt(storage.available));
    match program.execute(&context) {
        Ok(Value::Bool(b)) => Outcome::Bool(b),
        Ok(other) => Outcome::Other(match other {
            Value::String(s) => format!("the string {:?}", s.as_str()),
            Value::Int(i) => format!("the number {i}"),
            Value::UInt(u) => format!("the number {u}"),
            Value::Float(f) => format!("the number {f}"),
            Value::Null => "null".to_string(),
            Value::List(_) => "a list".to_string(),
            Value::Map(_) => "a map".to_string(),
            _ => "a non-boolean value".to_string(),
        }),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

//! Native unit tests of a sink: a [`Harness`] answers the host's imports (its config map,
//! scripted HTTP replies), records what the sink asked for, and runs `deliver` and
//! `check-config` the way the component's exports do.
//!
//! ```ignore
//! let mut harness = Harness::new().config("url", "https://hooks.example.com/in").reply(Response::new(204, ""));
//! let event = Event::new("RoomHeatChanged", "room-1", serde_json::json!({"heat": 7}));
//! assert_eq!(harness.deliver::<MySink>(&event), Ok(Outcome::Delivered));
//! assert_eq!(harness.requests()[0].url, "https://hooks.example.com/in");
//! ```

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};

use crate::http::{HttpError, Request, Response};
use crate::log::Level;
use crate::{Delivery, Event, Pressure, Sink, host};

/// The host, as a native test sees it.
#[derive(Debug, Default)]
pub struct Harness {
    config: BTreeMap<String, String>,
    replies: VecDeque<Result<Response, HttpError>>,
    requests: Vec<Request>,
    logs: Vec<(Level, String)>,
    pushed_back: Option<Pressure>,
    declared: Vec<(String, String)>,
}

thread_local! {
    static CURRENT: RefCell<Option<Harness>> = const { RefCell::new(None) };
}

impl Harness {
    /// No config, no replies.
    pub fn new() -> Harness {
        Harness::default()
    }

    /// Sets a key of the sink's `config:` map.
    pub fn config(mut self, key: &str, value: &str) -> Harness {
        self.config.insert(key.into(), value.into());
        self
    }

    /// The reply to the next request not yet answered.
    pub fn reply(mut self, response: Response) -> Harness {
        self.replies.push_back(Ok(response));
        self
    }

    /// An error in place of the next reply.
    pub fn fail(mut self, error: HttpError) -> Harness {
        self.replies.push_back(Err(error));
        self
    }

    /// Runs a delivery as the component would (with a fresh `configure`).
    pub fn deliver<S: Sink>(&mut self, event: &Event) -> Delivery {
        self.pushed_back = None;
        self.run(|| crate::deliver::<S>(event))
    }

    /// Runs `check-config` as the component would: one line per problem.
    pub fn check_config<S: Sink>(&mut self) -> Vec<String> {
        self.run(crate::__check_config::<S>)
    }

    /// The requests made so far.
    pub fn requests(&self) -> &[Request] {
        &self.requests
    }

    /// The lines logged so far.
    pub fn logs(&self) -> &[(Level, String)] {
        &self.logs
    }

    /// The endpoints declared so far (`Config::endpoint`): (key, url).
    pub fn declared(&self) -> &[(String, String)] {
        &self.declared
    }

    /// What the last delivery told the host's `flow.push-back`, if anything.
    pub fn pushed_back(&self) -> Option<Pressure> {
        self.pushed_back
    }

    /// Runs `code` with this harness answering the host's imports (outside one, config keys
    /// are absent, requests fail and log lines are dropped).
    pub fn run<T>(&mut self, code: impl FnOnce() -> T) -> T {
        CURRENT.with(|current| *current.borrow_mut() = Some(std::mem::take(self)));
        host::native::answer_with(Some(&ANSWERS));
        let result = code();
        host::native::answer_with(None);
        *self = CURRENT.with(|current| current.borrow_mut().take()).unwrap_or_default();
        result
    }
}

/// The harness's answers to the host's imports, in the contract's types.
static ANSWERS: host::native::Answers = host::native::Answers { config_get, send, log, push_back, declare };

/// `use_it` on the running harness, if there is one.
fn with<T>(use_it: impl FnOnce(&mut Harness) -> T) -> Option<T> {
    CURRENT.with(|current| current.borrow_mut().as_mut().map(use_it))
}

fn config_get(key: &str) -> Option<String> {
    with(|h| h.config.get(key).cloned()).flatten()
}

fn send(request: &host::Request) -> Result<host::Response, host::HttpError> {
    let reply = with(|h| {
        h.requests.push(request.clone().into());
        h.replies.pop_front().unwrap_or_else(|| Err(HttpError::Transport("the harness has no reply left".into())))
    });
    let reply = reply.unwrap_or_else(|| Err(HttpError::Transport("no testing::Harness is running".into())));
    reply.map(Into::into).map_err(Into::into)
}

fn log(level: host::Level, message: &str) {
    with(|h| h.logs.push((level.into(), message.into())));
}

fn push_back(pressure: host::Pressure) {
    with(|h| h.pushed_back = Some(pressure.into()));
}

fn declare(key: &str, url: &str) {
    with(|h| h.declared.push((key.into(), url.into())));
}

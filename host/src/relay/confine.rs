//! Where a relay may publish. A relay component is third-party code: the destination it
//! returns is as untrusted as a sink's URL. Each broker entry's `allowed_destinations` are
//! patterns in that broker's own wildcard syntax, and every record's destination must match
//! one before it is published. Destinations that reach a broker's control plane (the
//! JetStream API, `$SYS`, reply inboxes, MQTT's `$` topics, the host's own Redis dedup
//! markers, RabbitMQ's server-named queues, Kafka's internal `__` topics) are refused
//! whatever the patterns say.
//!
//! | kind | one token | any tokens | separator |
//! | --- | --- | --- | --- |
//! | NATS | `*` | `>` (one or more, last) | `.` |
//! | RabbitMQ | `*` | `#` (zero or more, anywhere) | `.` |
//! | MQTT | `+` | `#` (zero or more, last) | `/` |
//! | Redis, Kafka | glob: `*` any run, `?` one character, `[abc]`, `[a-z]`, `[^a]`, `\x` | | |

use super::settings::BrokerKind;

/// The prefix of the host's own Redis dedup markers (`outbox-dedup:{<stream>}:<id>`).
pub const REDIS_MARKER_PREFIX: &str = "outbox-dedup:";

/// How a broker's patterns read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Syntax {
    /// Tokens between separators, with a one-token and an any-tokens wildcard.
    Tokens { separator: char, one: &'static str, any: &'static str, any_min: usize, any_last: bool },
    /// Redis's glob.
    Glob,
}

impl Syntax {
    fn of(kind: BrokerKind) -> Syntax {
        match kind {
            BrokerKind::Nats => Syntax::Tokens { separator: '.', one: "*", any: ">", any_min: 1, any_last: true },
            BrokerKind::Rabbitmq => Syntax::Tokens { separator: '.', one: "*", any: "#", any_min: 0, any_last: false },
            BrokerKind::Mqtt => Syntax::Tokens { separator: '/', one: "+", any: "#", any_min: 0, any_last: true },
            BrokerKind::Redis | BrokerKind::Kafka => Syntax::Glob,
        }
    }
}

/// The destinations one broker's relays may publish to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destinations {
    broker: String,
    kind: BrokerKind,
    patterns: Vec<String>,
    /// Prefixes of the broker's control plane.
    reserved: &'static [&'static str],
}

/// The control plane of each kind, as destination prefixes.
fn reserved(kind: BrokerKind, default_exchange: bool) -> &'static [&'static str] {
    match kind {
        // The JetStream and KV/object-store APIs, the system account, request inboxes.
        BrokerKind::Nats => &["$", "_INBOX."],
        // $SYS and every other broker-reserved topic.
        BrokerKind::Mqtt => &["$"],
        BrokerKind::Redis => &[REDIS_MARKER_PREFIX],
        // The cluster's own topics: `__consumer_offsets`, `__transaction_state`, and the
        // rest of the `__` names Kafka and its tools keep for themselves.
        BrokerKind::Kafka => &["__"],
        // On the default exchange a routing key is a queue's name: `amq.` names the
        // server's own queues (server-named reply queues, direct reply-to).
        BrokerKind::Rabbitmq if default_exchange => &["amq."],
        BrokerKind::Rabbitmq => &[],
    }
}

impl Destinations {
    /// Broker `broker`'s destinations: `patterns` (already checked by
    /// [`pattern_problem`]), outside the control plane. `default_exchange`: a RabbitMQ
    /// broker publishing to the default exchange, where a routing key names a queue.
    pub fn new(broker: &str, kind: BrokerKind, patterns: Vec<String>, default_exchange: bool) -> Destinations {
        Destinations { broker: broker.to_string(), kind, patterns, reserved: reserved(kind, default_exchange) }
    }

    /// What `config` allows: its `allowed_destinations`, or `default` when it names none.
    pub fn of(config: &super::settings::BrokerConfig, default: Vec<String>) -> Destinations {
        let patterns =
            if config.allowed_destinations.is_empty() { default } else { config.allowed_destinations.clone() };
        let default_exchange = config.kind == BrokerKind::Rabbitmq && config.exchange.is_empty();
        Destinations::new(&config.name, config.kind, patterns, default_exchange)
    }

    /// The patterns.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Whether a record may be published to `destination`; `Err` says why not (short, the
    /// destination escaped and clipped).
    pub fn admit(&self, destination: &str) -> Result<(), String> {
        let shown = crate::text::printable(destination, 120);
        self.outside_control_plane(destination, &format!("destination {shown:?} is"))?;
        if let Some(why) = unpublishable(self.kind, destination) {
            return Err(format!("broker {}: destination {shown:?} {why}", self.broker));
        }
        if self.patterns.iter().any(|p| matches(self.kind, p, destination, false)) {
            Ok(())
        } else {
            Err(format!(
                "broker {}: destination {shown:?} is outside allowed_destinations {:?}",
                self.broker, self.patterns
            ))
        }
    }

    /// Whether some destination that begins with `prefix` (a template's literal start)
    /// could be admitted; `Err` says why none can.
    pub fn admits_some_with_prefix(&self, prefix: &str) -> Result<(), String> {
        let shown = crate::text::printable(prefix, 120);
        self.outside_control_plane(prefix, &format!("destinations beginning {shown:?} are"))?;
        if self.patterns.iter().any(|p| matches(self.kind, p, prefix, true)) {
            Ok(())
        } else {
            Err(format!(
                "broker {}: no destination beginning {shown:?} is in allowed_destinations {:?}",
                self.broker, self.patterns
            ))
        }
    }
}

impl Destinations {
    /// `Err` when `text` starts on the broker's control plane; `what` names it in the message.
    fn outside_control_plane(&self, text: &str, what: &str) -> Result<(), String> {
        match self.reserved.iter().find(|r| text.starts_with(**r)) {
            Some(reserved) => Err(format!(
                "broker {}: {what} in the broker's control plane ({reserved}…), which a relay never reaches",
                self.broker
            )),
            None => Ok(()),
        }
    }
}

/// Why `destination` is no destination of `kind` at all (a wildcard or an empty token in
/// a subject or topic, which the broker would take as a subscription pattern; no Kafka
/// topic name).
fn unpublishable(kind: BrokerKind, destination: &str) -> Option<&'static str> {
    match kind {
        BrokerKind::Nats => destination
            .split('.')
            .any(|t| t.is_empty() || t == "*" || t == ">")
            .then_some("is not a subject one publishes to (an empty token or a wildcard)"),
        BrokerKind::Mqtt => {
            destination.contains(['+', '#']).then_some("is not a topic one publishes to (it holds a wildcard)")
        }
        BrokerKind::Kafka => topic_problem(destination),
        BrokerKind::Redis | BrokerKind::Rabbitmq => None,
    }
}

/// Why `topic` is no Kafka topic name (1 to 249 of `A-Z a-z 0-9 . _ -`, not `.` or `..`);
/// `None`: it is one.
pub fn topic_problem(topic: &str) -> Option<&'static str> {
    if topic.is_empty() || topic.len() > 249 {
        Some("is not a topic name: 1 to 249 characters")
    } else if !topic.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
        Some("is not a topic name: letters, digits, '.', '_' and '-' only")
    } else if topic == "." || topic == ".." {
        Some("is not a topic name")
    } else {
        None
    }
}

/// Why `pattern` is not a pattern of `kind` (`None`: it is one).
pub fn pattern_problem(kind: BrokerKind, pattern: &str) -> Option<String> {
    if pattern.is_empty() || pattern.len() > 256 || !pattern.chars().all(|c| c.is_ascii_graphic()) {
        return Some(format!("{pattern:?} is not 1 to 256 printable characters without spaces"));
    }
    if let Some(prefix) = reserved(kind, true).iter().find(|r| pattern.starts_with(**r)) {
        return Some(format!("{pattern:?} reaches the broker's control plane ({prefix}…), which a relay never may"));
    }
    match Syntax::of(kind) {
        Syntax::Tokens { separator, one, any, any_last, .. } => {
            let tokens: Vec<&str> = pattern.split(separator).collect();
            for (i, token) in tokens.iter().enumerate() {
                if token.is_empty() && kind != BrokerKind::Mqtt {
                    return Some(format!("{pattern:?} has an empty token"));
                }
                let wild = token.contains(one) || token.contains(any);
                if wild && *token != one && *token != any {
                    return Some(format!("{pattern:?}: a wildcard ({one} or {any}) stands alone in its token"));
                }
                if *token == any && any_last && i + 1 != tokens.len() {
                    return Some(format!("{pattern:?}: {any} comes last"));
                }
            }
            None
        }
        Syntax::Glob => glob_class_problem(pattern).map(|why| format!("{pattern:?}: {why}")),
    }
}

/// Whether `text` matches `pattern` of `kind`; with `prefix`, whether some text that
/// begins with `text` would.
fn matches(kind: BrokerKind, pattern: &str, text: &str, prefix: bool) -> bool {
    match Syntax::of(kind) {
        Syntax::Tokens { separator, one, any, any_min, any_last } => {
            let rules = Rules { one, any, any_min, any_anywhere: !any_last };
            let p: Vec<&str> = pattern.split(separator).collect();
            let t: Vec<&str> = text.split(separator).collect();
            if prefix {
                // The last piece may still grow; the ones before it are whole tokens.
                let (partial, whole) = t.split_last().expect("split yields at least one piece");
                starts(&p, whole, partial, &rules)
            } else {
                whole(&p, &t, &rules)
            }
        }
        Syntax::Glob => {
            let p: Vec<char> = pattern.chars().collect();
            let t: Vec<char> = text.chars().collect();
            glob(&p, &t, prefix)
        }
    }
}

struct Rules {
    one: &'static str,
    any: &'static str,
    any_min: usize,
    any_anywhere: bool,
}

/// Whether the tokens `t` match the pattern's tokens `p`.
fn whole(p: &[&str], t: &[&str], r: &Rules) -> bool {
    let Some((first, rest)) = p.split_first() else { return t.is_empty() };
    if *first == r.any {
        if !r.any_anywhere {
            return t.len() >= r.any_min;
        }
        return (0..=t.len()).any(|taken| taken >= r.any_min && whole(rest, &t[taken..], r));
    }
    match t.split_first() {
        Some((token, t_rest)) if *first == r.one || first == token => whole(rest, t_rest, r),
        _ => false,
    }
}

/// Whether some tokens that begin with `whole_tokens` and then a token beginning with
/// `partial` (and any tokens after it) match the pattern's tokens `p`.
fn starts(p: &[&str], whole_tokens: &[&str], partial: &str, r: &Rules) -> bool {
    let Some((first, rest)) = p.split_first() else { return false };
    if *first == r.any {
        if !r.any_anywhere {
            return true;
        }
        // Zero tokens, or the next one; with none left, it takes the growing one.
        return whole_tokens.is_empty()
            || starts(rest, whole_tokens, partial, r)
            || starts(p, &whole_tokens[1..], partial, r);
    }
    match whole_tokens.split_first() {
        Some((token, t_rest)) => (*first == r.one || first == token) && starts(rest, t_rest, partial, r),
        None => *first == r.one || first.starts_with(partial),
    }
}

/// Redis's glob: `*`, `?`, `[set]` (ranges, `^` negates), `\x`. With `prefix`, text that
/// ends before the pattern does still matches (more text may follow).
fn glob(p: &[char], t: &[char], prefix: bool) -> bool {
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    loop {
        if ti == t.len() {
            if prefix {
                return true;
            }
            return p[pi..].iter().all(|c| *c == '*');
        }
        let step = match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
                continue;
            }
            Some('?') => Some(1),
            Some('[') => class(&p[pi..], t[ti]),
            Some('\\') if pi + 1 < p.len() => (p[pi + 1] == t[ti]).then_some(2),
            Some(c) => (*c == t[ti]).then_some(1),
            None => None,
        };
        match step {
            Some(len) => {
                pi += len;
                ti += 1;
            }
            None => match star {
                Some((star_p, star_t)) => {
                    star = Some((star_p, star_t + 1));
                    pi = star_p + 1;
                    ti = star_t + 1;
                }
                None => return false,
            },
        }
    }
}

/// Whether the class at the start of `p` (`[…]`) takes `c`: how long the class is when it
/// does.
fn class(p: &[char], c: char) -> Option<usize> {
    let mut i = 1;
    let negated = p.get(i) == Some(&'^');
    if negated {
        i += 1;
    }
    let mut hit = false;
    while i < p.len() && p[i] != ']' {
        let mut low = p[i];
        if low == '\\' && i + 1 < p.len() {
            i += 1;
            low = p[i];
        }
        if p.get(i + 1) == Some(&'-') && p.get(i + 2).is_some_and(|h| *h != ']') {
            hit |= (low..=p[i + 2]).contains(&c);
            i += 3;
        } else {
            hit |= low == c;
            i += 1;
        }
    }
    (i < p.len() && hit != negated).then_some(i + 1)
}

/// Why a glob's classes do not close.
fn glob_class_problem(pattern: &str) -> Option<&'static str> {
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '[' => loop {
                match chars.next() {
                    Some(']') => break,
                    Some('\\') => {
                        chars.next();
                    }
                    Some(_) => {}
                    None => return Some("a '[' is not closed by ']'"),
                }
            },
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nats(patterns: &[&str]) -> Destinations {
        Destinations::new("js", BrokerKind::Nats, patterns.iter().map(|p| p.to_string()).collect(), false)
    }

    #[test]
    fn nats_subjects_match_by_token_and_the_control_plane_is_refused() {
        let d = nats(&["rooms.>", "audit.*.done"]);
        assert!(d.admit("rooms.a").is_ok());
        assert!(d.admit("rooms.a.b.c").is_ok());
        assert!(d.admit("rooms").is_err(), "> takes one token at least");
        assert!(d.admit("roomsx.a").is_err());
        assert!(d.admit("audit.x.done").is_ok());
        assert!(d.admit("audit.x.y.done").is_err());
        assert!(d.admit("other.a").unwrap_err().contains("outside allowed_destinations"));
        let everything = nats(&[">"]);
        for control in ["$JS.API.STREAM.PURGE.OTHER", "$SYS.REQ.SERVER.PING", "$KV.b.k", "$O.x", "_INBOX.abc"] {
            let why = everything.admit(control).unwrap_err();
            assert!(why.contains("control plane"), "{control}: {why}");
        }
        assert!(everything.admit("rooms.*").unwrap_err().contains("wildcard"));
        assert!(everything.admit("rooms..a").is_err());
    }

    #[test]
    fn rabbitmq_hash_takes_zero_or_more_words_anywhere() {
        let d = Destinations::new("q", BrokerKind::Rabbitmq, vec!["rooms.#.gift".into(), "#".into()], false);
        assert!(d.admit("anything.at.all").is_ok());
        let d = Destinations::new("q", BrokerKind::Rabbitmq, vec!["rooms.#.gift".into()], false);
        assert!(d.admit("rooms.gift").is_ok());
        assert!(d.admit("rooms.a.b.gift").is_ok());
        assert!(d.admit("rooms.a.b").is_err());
        let default_exchange = Destinations::new("q", BrokerKind::Rabbitmq, vec!["#".into()], true);
        assert!(default_exchange.admit("amq.rabbitmq.reply-to").unwrap_err().contains("control plane"));
        assert!(default_exchange.admit("orders").is_ok());
    }

    #[test]
    fn mqtt_plus_is_one_level_and_hash_the_rest_including_none() {
        let d = Destinations::new("m", BrokerKind::Mqtt, vec!["rooms/+/events/#".into()], false);
        assert!(d.admit("rooms/r1/events").is_ok());
        assert!(d.admit("rooms/r1/events/gift/x").is_ok());
        assert!(d.admit("rooms/r1/other").is_err());
        assert!(d.admit("rooms/r1/events/+").unwrap_err().contains("wildcard"));
        let all = Destinations::new("m", BrokerKind::Mqtt, vec!["#".into()], false);
        assert!(all.admit("$SYS/broker/clients").unwrap_err().contains("control plane"));
    }

    #[test]
    fn redis_keys_match_by_glob_and_the_dedup_markers_are_refused() {
        let d = Destinations::new("r", BrokerKind::Redis, vec!["rooms:*".into(), "audit:[a-c]?".into()], false);
        assert!(d.admit("rooms:r1").is_ok());
        assert!(d.admit("rooms:").is_ok());
        assert!(d.admit("audit:b1").is_ok());
        assert!(d.admit("audit:d1").is_err());
        assert!(d.admit("audit:b12").is_err());
        assert!(d.admit("orders").is_err());
        let all = Destinations::new("r", BrokerKind::Redis, vec!["*".into()], false);
        assert!(all.admit("outbox-dedup:{rooms:r1}:e1").unwrap_err().contains("control plane"));
        let negated = Destinations::new("r", BrokerKind::Redis, vec!["[^x]*".into()], false);
        assert!(negated.admit("abc").is_ok());
        assert!(negated.admit("xbc").is_err());
    }

    #[test]
    fn kafka_topics_match_by_glob_are_topic_names_and_never_the_clusters_own() {
        let d = Destinations::new("k", BrokerKind::Kafka, vec!["room-events".into(), "audit.*".into()], false);
        assert!(d.admit("room-events").is_ok());
        assert!(d.admit("audit.gifts").is_ok());
        assert!(d.admit("room-events-2").unwrap_err().contains("outside allowed_destinations"));
        assert!(d.admit("audit.a b").unwrap_err().contains("not a topic name"));
        assert!(d.admit("audit..").is_ok(), "dots are a topic's own characters");
        let all = Destinations::new("k", BrokerKind::Kafka, vec!["*".into()], false);
        assert!(all.admit("__consumer_offsets").unwrap_err().contains("control plane"));
        assert!(all.admit("__transaction_state").unwrap_err().contains("control plane"));
        assert!(all.admit(&"t".repeat(250)).unwrap_err().contains("1 to 249"));
        assert!(pattern_problem(BrokerKind::Kafka, "__*").unwrap().contains("control plane"));
        assert!(all.admits_some_with_prefix("__").unwrap_err().contains("control plane"));
    }

    #[test]
    fn a_templates_literal_prefix_fits_when_some_destination_could() {
        let d = nats(&["rooms.>"]);
        assert!(d.admits_some_with_prefix("rooms.").is_ok());
        assert!(d.admits_some_with_prefix("roo").is_ok());
        assert!(d.admits_some_with_prefix("").is_ok());
        assert!(d.admits_some_with_prefix("orders.").unwrap_err().contains("no destination beginning"));
        assert!(d.admits_some_with_prefix("$JS.API.").unwrap_err().contains("control plane"));
        let d = nats(&["rooms.app1.*"]);
        assert!(d.admits_some_with_prefix("rooms.").is_ok());
        assert!(d.admits_some_with_prefix("rooms.app2.").is_err());
        let amqp = Destinations::new("q", BrokerKind::Rabbitmq, vec!["a.#.z".into()], false);
        assert!(amqp.admits_some_with_prefix("a.b.c.").is_ok());
        assert!(amqp.admits_some_with_prefix("b.").is_err());
        let redis = Destinations::new("r", BrokerKind::Redis, vec!["rooms:*".into()], false);
        assert!(redis.admits_some_with_prefix("rooms:").is_ok());
        assert!(redis.admits_some_with_prefix("ro").is_ok());
        assert!(redis.admits_some_with_prefix("orders:").is_err());
    }

    #[test]
    fn patterns_in_the_wrong_syntax_or_on_the_control_plane_are_refused() {
        assert!(pattern_problem(BrokerKind::Nats, "rooms.>").is_none());
        assert!(pattern_problem(BrokerKind::Nats, "rooms.>.x").unwrap().contains("comes last"));
        assert!(pattern_problem(BrokerKind::Nats, "rooms.a*").unwrap().contains("stands alone"));
        assert!(pattern_problem(BrokerKind::Nats, "$JS.API.>").unwrap().contains("control plane"));
        assert!(pattern_problem(BrokerKind::Mqtt, "a/#/b").unwrap().contains("comes last"));
        assert!(pattern_problem(BrokerKind::Mqtt, "$SYS/#").is_some());
        assert!(pattern_problem(BrokerKind::Rabbitmq, "a.#.b").is_none());
        assert!(pattern_problem(BrokerKind::Redis, "rooms:[ab").unwrap().contains("not closed"));
        assert!(pattern_problem(BrokerKind::Redis, "outbox-dedup:*").is_some());
        assert!(pattern_problem(BrokerKind::Redis, "").is_some());
    }
}

//! The Tencent Cloud IM sink. Placeholder: it answers `skipped` for every event, without
//! any HTTP call, until the real mapping, signing and classification land.

wit_bindgen::generate!({ path: "../../wit", world: "sink" });


struct TencentIm;

impl Guest for TencentIm {
    fn check_config() -> Vec<String> {
        Vec::new()
    }

    fn deliver(event: Event) -> Result<Outcome, Failure> {
        Ok(Outcome::Skipped(format!("tencent-im sink is a placeholder; {} not sent", event.event_type)))
    }
}

export!(TencentIm);

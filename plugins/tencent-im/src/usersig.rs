//! TLSSigAPIv2: the UserSig Tencent Cloud IM's REST API is called with, made inside the
//! sink from the application's secret key.
//!
//! `TLS.sig` = base64(HMAC-SHA256(key, "TLS.identifier:…\nTLS.sdkappid:…\nTLS.time:…\nTLS.expire:…\n"));
//! the UserSig is the JSON document holding it, zlib-compressed, in Tencent's base64 variant
//! (`+`→`*`, `/`→`-`, `=`→`_`).

use std::io::Write as _;

use outbox_sink::serde_json;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// `TLS.sig`: the HMAC over the signed fields, in standard base64.
pub fn signature(sdk_app_id: u64, key: &str, identifier: &str, time: u64, expire: u64) -> String {
    let content =
        format!("TLS.identifier:{identifier}\nTLS.sdkappid:{sdk_app_id}\nTLS.time:{time}\nTLS.expire:{expire}\n");
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(content.as_bytes());
    STANDARD.encode(mac.finalize().into_bytes())
}

/// A UserSig for `identifier`, valid `expire` seconds from `time` (Unix seconds).
pub fn generate(sdk_app_id: u64, key: &str, identifier: &str, time: u64, expire: u64) -> String {
    let document = serde_json::json!({
        "TLS.ver": "2.0",
        "TLS.identifier": identifier,
        "TLS.sdkappid": sdk_app_id,
        "TLS.expire": expire,
        "TLS.time": time,
        "TLS.sig": signature(sdk_app_id, key, identifier, time, expire),
    });
    let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    zlib.write_all(document.to_string().as_bytes()).expect("writing to memory");
    let compressed = zlib.finish().expect("writing to memory");
    STANDARD.encode(compressed).replace('+', "*").replace('/', "-").replace('=', "_")
}

/// Decodes a UserSig back into its JSON document (for tests and diagnostics).
pub fn decode(usersig: &str) -> Result<serde_json::Value, String> {
    use std::io::Read as _;
    let standard = usersig.replace('*', "+").replace('-', "/").replace('_', "=");
    let compressed = STANDARD.decode(standard).map_err(|e| format!("not base64: {e}"))?;
    let mut json = String::new();
    flate2::read::ZlibDecoder::new(compressed.as_slice())
        .read_to_string(&mut json)
        .map_err(|e| format!("not zlib: {e}"))?;
    serde_json::from_str(&json).map_err(|e| format!("not JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tencent's published TLSSigAPIv2 test vector.
    const KEY: &str = "5bd2850fff3ecb11d7c805251c51ee463a25727bddc2385f3fa8bfee1bb93b5e";
    const SIG: &str = "CpjuBdQs9ZwnuGAJR8onoOeI9fweX2vIMMY94iOJWJY=";

    #[test]
    fn the_published_vector_signs_to_its_tls_sig() {
        assert_eq!(signature(1_400_000_000, KEY, "0", 1_569_910_200, 15_552_000), SIG);
    }

    #[test]
    fn a_usersig_decodes_to_a_document_whose_hmac_verifies() {
        let usersig = generate(1_400_000_000, KEY, "0", 1_569_910_200, 15_552_000);
        assert!(!usersig.contains(['+', '/', '=']), "not Tencent's base64 variant: {usersig}");
        let doc = decode(&usersig).unwrap();
        assert_eq!(doc["TLS.ver"], "2.0");
        assert_eq!(doc["TLS.identifier"], "0");
        assert_eq!(doc["TLS.sdkappid"], 1_400_000_000u64);
        assert_eq!(doc["TLS.time"], 1_569_910_200u64);
        assert_eq!(doc["TLS.expire"], 15_552_000u64);
        // Recompute the HMAC from the decoded fields: it must be the vector's.
        let recomputed = signature(
            doc["TLS.sdkappid"].as_u64().unwrap(),
            KEY,
            doc["TLS.identifier"].as_str().unwrap(),
            doc["TLS.time"].as_u64().unwrap(),
            doc["TLS.expire"].as_u64().unwrap(),
        );
        assert_eq!(doc["TLS.sig"], recomputed.as_str());
        assert_eq!(recomputed, SIG);
    }

    #[test]
    fn another_key_does_not_verify() {
        let doc = decode(&generate(1_400_000_000, KEY, "0", 1_569_910_200, 15_552_000)).unwrap();
        assert_ne!(doc["TLS.sig"], signature(1_400_000_000, "other", "0", 1_569_910_200, 15_552_000).as_str());
    }
}

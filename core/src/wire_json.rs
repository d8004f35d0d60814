//! JSON spellings of contract enums where a number would be unreadable. Protobuf (what the
//! filter speaks) is unaffected; JSON picks (humans, tests, benchmarks) read
//! `"degraded_reason": "unknown_model"`, `""` when the decision was not degraded.

pub mod degraded_reason {
    use crate::wire::DegradedReason;
    use serde::{Deserialize, Deserializer, Serializer};

    const ALL: [DegradedReason; 12] = [
        DegradedReason::DegradedNone,
        DegradedReason::DegradedTokenizerUnavailable,
        DegradedReason::DegradedUnknownModel,
        DegradedReason::DegradedNoHealthyWorker,
        DegradedReason::DegradedBlockSizeMismatch,
        DegradedReason::DegradedStateUnavailable,
        DegradedReason::DegradedResponseOwnerGone,
        DegradedReason::DegradedResponseNotFound,
        DegradedReason::DegradedUnreadBody,
        DegradedReason::DegradedTokenizeDeadline,
        DegradedReason::DegradedTokenizeBusy,
        DegradedReason::DegradedPromptNotTokenizable,
    ];

    pub fn serialize<S: Serializer>(value: &i32, s: S) -> Result<S::Ok, S::Error> {
        match DegradedReason::try_from(*value) {
            Ok(DegradedReason::DegradedNone) => s.serialize_str(""),
            Ok(reason) => s.serialize_str(reason.label()),
            // A value this build does not know: its number, rather than a wrong name.
            Err(_) => s.serialize_i32(*value),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Label(String),
        Number(i32),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
        match Either::deserialize(d)? {
            Either::Number(n) => Ok(n),
            Either::Label(l) if l.is_empty() => Ok(DegradedReason::DegradedNone as i32),
            Either::Label(l) => ALL
                .iter()
                .find(|r| r.label() == l)
                .map(|r| *r as i32)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown degraded_reason {l:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::wire::{DegradedReason, PickResponse};

    #[test]
    fn degraded_reason_reads_as_its_label_in_json() {
        let mut r = PickResponse::default();
        assert_eq!(serde_json::to_value(&r).unwrap()["degraded_reason"], "");
        r.set_degraded_reason(DegradedReason::DegradedUnknownModel);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["degraded_reason"], "unknown_model");
        let back: PickResponse = serde_json::from_value(json).unwrap();
        assert_eq!(back.degraded_reason(), DegradedReason::DegradedUnknownModel);
        let numeric: PickResponse = serde_json::from_str(r#"{"degraded_reason": 5}"#).unwrap();
        assert_eq!(numeric.degraded_reason(), DegradedReason::DegradedStateUnavailable);
        assert!(serde_json::from_str::<PickResponse>(r#"{"degraded_reason": "nope"}"#).is_err());
    }
}

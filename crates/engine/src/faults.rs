//! Scripted faults: what a sick replica does, switched on by flag or at run time, never at random.

use crate::cost::FrontendCost;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;
use std::time::Duration;

/// Every `nth` request (counted from the moment the fault is set) is answered with `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailEvery {
    pub nth: NonZeroU32,
    pub status: u16,
}

/// The faults in force; the admin endpoint returns this shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// New requests stop producing after this many tokens, holding their slot and KV blocks until
    /// the client leaves. `0` never sends the first token (a hung engine).
    pub stall_after_tokens: Option<u32>,
    pub fail_every: Option<FailEvery>,
    /// The listener is closed (connections are refused) and open connections are closed once idle.
    pub refuse_connections: bool,
    /// Every step takes this many times its modelled cost: a degraded GPU. 1.0 is healthy.
    pub slow_factor: f64,
    /// `DCGM_FI_DEV_XID_ERRORS`: the last XID error seen, 0 for none.
    pub xid: u32,
    /// `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL`: double-bit ECC errors.
    pub ecc_dbe: u64,
    /// A CPU-starved API server: its serial work costs this instead of the preset's.
    pub frontend: Option<FrontendCost>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            stall_after_tokens: None,
            fail_every: None,
            refuse_connections: false,
            slow_factor: 1.0,
            xid: 0,
            ecc_dbe: 0,
            frontend: None,
        }
    }
}

/// `POST /admin/faults`: fields present are changed, the rest kept. `clear` first resets all.
/// `loading` starts a slow start (health and requests answer 503) for that long; `crash` stops the
/// replica as a killed process would.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultPatch {
    #[serde(default)]
    pub clear: bool,
    #[serde(default, deserialize_with = "some_option")]
    pub stall_after_tokens: Option<Option<u32>>,
    #[serde(default, deserialize_with = "some_option")]
    pub fail_every: Option<Option<FailEvery>>,
    pub refuse_connections: Option<bool>,
    pub slow_factor: Option<f64>,
    pub xid: Option<u32>,
    pub ecc_dbe: Option<u64>,
    #[serde(default, deserialize_with = "some_option")]
    pub frontend: Option<Option<FrontendCost>>,
    #[serde(default, with = "opt_duration")]
    pub loading: Option<Duration>,
    #[serde(default)]
    pub crash: bool,
}

impl FaultPatch {
    /// Applies the patch; an impossible value leaves the faults unchanged and says why.
    pub fn apply_to(&self, faults: &mut Faults) -> Result<(), crate::EngineError> {
        self.apply(faults).map_err(crate::EngineError::Invalid)
    }

    fn apply(&self, faults: &mut Faults) -> Result<(), String> {
        let mut next = if self.clear {
            Faults::default()
        } else {
            faults.clone()
        };
        if let Some(v) = self.stall_after_tokens {
            next.stall_after_tokens = v;
        }
        if let Some(v) = self.fail_every {
            if let Some(f) = v
                && !(400..=599).contains(&f.status)
            {
                return Err(format!("fail_every.status must be 400–599, got {}", f.status));
            }
            next.fail_every = v;
        }
        if let Some(v) = self.refuse_connections {
            next.refuse_connections = v;
        }
        if let Some(v) = self.slow_factor {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("slow_factor must be a positive number, got {v}"));
            }
            next.slow_factor = v;
        }
        if let Some(v) = self.xid {
            next.xid = v;
        }
        if let Some(v) = self.ecc_dbe {
            next.ecc_dbe = v;
        }
        if let Some(v) = self.frontend {
            next.frontend = v;
        }
        *faults = next;
        Ok(())
    }
}

/// Distinguishes an absent field (`None`) from an explicit `null` (`Some(None)`, which clears it).
fn some_option<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

mod opt_duration {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s = Option::<String>::deserialize(d)?;
        s.map(|s| humantime::parse_duration(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_sets_clears_and_refuses_nonsense() {
        let mut f = Faults::default();
        let p: FaultPatch = serde_json::from_str(
            r#"{"stall_after_tokens": 0, "fail_every": {"nth": 3, "status": 503}, "slow_factor": 2.0}"#,
        )
        .unwrap();
        p.apply_to(&mut f).unwrap();
        assert_eq!(f.stall_after_tokens, Some(0));
        assert_eq!(f.fail_every.unwrap().nth.get(), 3);
        let p: FaultPatch = serde_json::from_str(r#"{"stall_after_tokens": null}"#).unwrap();
        p.apply_to(&mut f).unwrap();
        assert_eq!(f.stall_after_tokens, None);
        assert_eq!(f.slow_factor, 2.0, "absent fields are kept");
        let p: FaultPatch = serde_json::from_str(r#"{"slow_factor": -1}"#).unwrap();
        assert!(p.apply_to(&mut f).is_err());
        assert_eq!(f.slow_factor, 2.0, "a refused patch changes nothing");
        assert!(serde_json::from_str::<FaultPatch>(r#"{"stal": 1}"#).is_err());
        let p: FaultPatch =
            serde_json::from_str(r#"{"frontend": {"per_request": "40ms", "per_output_token": "1ms"}}"#)
                .unwrap();
        p.apply_to(&mut f).unwrap();
        assert_eq!(f.frontend.unwrap().per_request, Duration::from_millis(40));
        let p: FaultPatch = serde_json::from_str(r#"{"clear": true, "loading": "2s"}"#).unwrap();
        p.apply_to(&mut f).unwrap();
        assert_eq!(f, Faults::default());
        assert_eq!(p.loading, Some(Duration::from_secs(2)));
    }
}

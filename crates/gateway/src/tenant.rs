//! Identifying the tenant from `Authorization: Bearer <key>`: keys are configured as SHA-256
//! digests and compared in constant time, so neither the file nor the timing reveals a key.

use crate::config::{Priority, TenantConfig};
use crate::error::GatewayError;
use admission::quota::{Quota, QuotaLimits};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// A team, as requests carry it through the pipeline.
pub(crate) struct Tenant {
    /// An `Arc`, so that each request's access record shares it instead of copying it.
    pub(crate) team: Arc<str>,
    pub(crate) models: Vec<String>,
    pub(crate) priority: Priority,
    /// The team's whole quota (shared through Redis); `quota` enforces this gateway's share of it
    /// when Redis is unreachable, and the whole of it when there is no Redis.
    pub(crate) limits: QuotaLimits,
    pub(crate) quota: Arc<Quota>,
    /// Its share of a contended class under `fairness: teams`.
    pub(crate) weight: f64,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("team", &self.team)
            .finish_non_exhaustive()
    }
}

impl Tenant {
    /// The single tenant of a gateway with no `tenants:` section.
    fn anonymous() -> Tenant {
        Tenant {
            team: "anonymous".into(),
            models: Vec::new(),
            priority: Priority::Standard,
            limits: QuotaLimits::default(),
            quota: Quota::new("anonymous", QuotaLimits::default()),
            weight: 1.0,
        }
    }

    pub(crate) fn may_use(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }
}

/// The configured keys; none means every request is the anonymous tenant.
pub(crate) struct Tenants {
    keys: Vec<([u8; 32], usize)>,
    tenants: Vec<Arc<Tenant>>,
    anonymous: Arc<Tenant>,
}

impl Tenants {
    /// Builds the tenants; on a reload, a team that stays keeps its quota state (`previous`), and
    /// a key no longer listed is refused from the next request on.
    pub(crate) fn new(
        config: &[TenantConfig],
        previous: Option<&Tenants>,
        redis: Option<&crate::config::RedisConfig>,
    ) -> Tenants {
        let mut t = Tenants {
            keys: Vec::new(),
            tenants: Vec::new(),
            anonymous: previous.map_or_else(|| Arc::new(Tenant::anonymous()), |p| p.anonymous.clone()),
        };
        for (i, c) in config.iter().enumerate() {
            let limits = QuotaLimits {
                max_parallel: c.max_parallel,
                rpm: c.rpm,
                tpm: c.tpm,
            };
            // While Redis is unreachable, this gateway enforces its share of the team's limits.
            let local = redis.map_or(limits, |r| limits.share(r.gateways));
            let quota = match previous.and_then(|p| p.tenants.iter().find(|k| *k.team == *c.team)) {
                Some(kept) => {
                    kept.quota.set_limits(local);
                    kept.quota.clone()
                }
                None => Quota::new(&c.team, local),
            };
            t.tenants.push(Arc::new(Tenant {
                team: c.team.as_str().into(),
                models: c.models.clone(),
                priority: c.priority,
                limits,
                quota,
                weight: c.weight,
            }));
            for hex in &c.key_sha256 {
                let mut digest = [0u8; 32];
                for (k, byte) in digest.iter_mut().enumerate() {
                    // Validated as 64 hex digits at load.
                    *byte = u8::from_str_radix(&hex[2 * k..2 * k + 2], 16).unwrap_or(0);
                }
                t.keys.push((digest, i));
            }
        }
        t
    }

    pub(crate) fn is_open(&self) -> bool {
        self.tenants.is_empty()
    }

    /// The tenant of a request's `Authorization` header value.
    pub(crate) fn identify(&self, authorization: Option<&str>) -> Result<Arc<Tenant>, GatewayError> {
        if self.is_open() {
            return Ok(self.anonymous.clone());
        }
        let key = authorization
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .ok_or(GatewayError::MissingKey)?;
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        // Compare against every key, always all of them, without early exit.
        let mut found = usize::MAX;
        for (candidate, tenant) in &self.keys {
            if digests_equal(candidate, &digest) {
                found = *tenant;
            }
        }
        self.tenants.get(found).cloned().ok_or(GatewayError::InvalidKey)
    }
}

/// A new API key: 32 random bytes from the operating system's generator, as 64 hex digits after
/// a `sk-spw-` prefix (so that secret scanners can recognise it).
pub fn new_key() -> String {
    let bytes: [u8; 32] = rand::random();
    let mut key = String::with_capacity(71);
    key.push_str("sk-spw-");
    for b in bytes {
        key.push_str(&format!("{b:02x}"));
    }
    key
}

/// What the configuration holds for a key: the hex SHA-256 of its bytes.
pub fn key_sha256(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Compares two digests in time that does not depend on where they differ.
pub(crate) fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Vec<TenantConfig> {
        vec![TenantConfig {
            team: "search".into(),
            // sha256("test")
            key_sha256: vec!["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into()],
            models: vec!["corp-chat".into()],
            priority: Priority::Critical,
            max_parallel: None,
            rpm: None,
            tpm: None,
            weight: 1.0,
        }]
    }

    #[test]
    fn keys_are_matched_by_digest() {
        let t = Tenants::new(&config(), None, None);
        let tenant = t.identify(Some("Bearer test")).unwrap();
        assert_eq!(&*tenant.team, "search");
        assert!(tenant.may_use("corp-chat") && !tenant.may_use("other"));
        assert_eq!(
            t.identify(Some("Bearer nope")).unwrap_err().code(),
            "invalid_api_key"
        );
        assert_eq!(t.identify(None).unwrap_err().status(), 401);
        assert_eq!(
            t.identify(Some("Basic dGVzdA==")).unwrap_err().code(),
            "missing_api_key"
        );
    }

    #[test]
    fn new_keys_are_distinct_and_hash_like_sha256sum() {
        let (a, b) = (new_key(), new_key());
        assert_ne!(a, b);
        assert_eq!(a.len(), 71);
        assert_eq!(
            key_sha256("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
        let t = Tenants::new(
            &[TenantConfig {
                key_sha256: vec![key_sha256(&a)],
                ..config().remove(0)
            }],
            None,
            None,
        );
        assert_eq!(&*t.identify(Some(&format!("Bearer {a}"))).unwrap().team, "search");
        assert!(t.identify(Some(&format!("Bearer {b}"))).is_err());
    }

    #[test]
    fn no_tenants_means_anonymous() {
        let t = Tenants::new(&[], None, None);
        assert_eq!(&*t.identify(None).unwrap().team, "anonymous");
    }
}

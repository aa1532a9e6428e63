//! Identifying the tenant from `Authorization: Bearer <key>`: keys are configured as SHA-256
//! digests and compared in constant time, so neither the file nor the timing reveals a key.

use crate::config::{Priority, TenantConfig};
use crate::error::GatewayError;
use sha2::{Digest, Sha256};

/// A team, as requests carry it through the pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tenant {
    pub team: String,
    pub models: Vec<String>,
    pub priority: Priority,
}

impl Tenant {
    /// The single tenant of a gateway with no `tenants:` section.
    pub(crate) fn anonymous() -> Tenant {
        Tenant {
            team: "anonymous".into(),
            models: Vec::new(),
            priority: Priority::Standard,
        }
    }

    pub(crate) fn may_use(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }
}

/// The configured keys; empty means every request is the anonymous tenant.
#[derive(Debug, Default)]
pub(crate) struct Tenants {
    keys: Vec<([u8; 32], usize)>,
    tenants: Vec<Tenant>,
}

impl Tenants {
    pub(crate) fn new(config: &[TenantConfig]) -> Tenants {
        let mut t = Tenants::default();
        for (i, c) in config.iter().enumerate() {
            t.tenants.push(Tenant {
                team: c.team.clone(),
                models: c.models.clone(),
                priority: c.priority,
            });
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
    pub(crate) fn identify(&self, authorization: Option<&str>) -> Result<Tenant, GatewayError> {
        if self.is_open() {
            return Ok(Tenant::anonymous());
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
        }]
    }

    #[test]
    fn keys_are_matched_by_digest() {
        let t = Tenants::new(&config());
        let tenant = t.identify(Some("Bearer test")).unwrap();
        assert_eq!(tenant.team, "search");
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
    fn no_tenants_means_anonymous() {
        let t = Tenants::new(&[]);
        assert_eq!(t.identify(None).unwrap(), Tenant::anonymous());
    }
}

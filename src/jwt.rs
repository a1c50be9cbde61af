//! `user` from a verified JWT (docs/design.md#keys-and-identity): `Authorization: Bearer <JWT>`,
//! verified with an HS256 secret or an RS256/ES256 public key, the user
//! taken from one claim (`sub` by default).
//!
//! A token is trusted only after `jsonwebtoken` has checked its signature
//! with the configured algorithm — the token's own `alg` header is never
//! believed, so `alg: none` and an HS256 token signed with a public key are
//! both refused — and its `exp` (required) and `nbf` with 30 s of leeway
//! for clock skew. A token that fails any check gives *no* user identity:
//! the key's fallback chain goes on to the next source (`user | ip` limits
//! by IP), so a forged token never buys a fresh bucket. Refusals are
//! counted, and logged with the running count at 1, 2, 4, 8, … so a flood
//! of bad tokens cannot flood the log.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode};
use tracing::warn;

/// Seconds of clock skew tolerated on `exp` and `nbf`.
const LEEWAY_SECS: u64 = 30;

/// A configured verifier. Cheap to clone.
#[derive(Clone)]
pub struct JwtVerifier {
    key: Arc<DecodingKey>,
    validation: Arc<Validation>,
    claim: Arc<str>,
    /// The claim naming the caller's plan (`plans_from: claim:NAME`).
    plan_claim: Option<Arc<str>>,
    rejected: Arc<AtomicU64>,
}

/// What a verified token says about its caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verified {
    /// The user's claim, when present.
    pub user: Option<Vec<u8>>,
    /// The plan's claim, when one is configured and present.
    pub plan: Option<Vec<u8>>,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("algorithms", &self.validation.algorithms)
            .field("claim", &self.claim)
            .finish_non_exhaustive()
    }
}

/// The algorithms a verifier can be configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtAlgorithm {
    /// HMAC-SHA256 with a shared secret.
    Hs256,
    /// RSA PKCS#1 v1.5 with SHA-256, public key in PEM.
    Rs256,
    /// ECDSA P-256 with SHA-256, public key in PEM.
    Es256,
}

impl JwtAlgorithm {
    /// Every spelling `users.jwt.algorithm` accepts, with its value; read
    /// by the configuration loader and by `tollgate schema`.
    pub const SPELLINGS: [(&'static str, Self); 3] = [
        ("HS256", Self::Hs256),
        ("RS256", Self::Rs256),
        ("ES256", Self::Es256),
    ];
}

impl JwtVerifier {
    /// A verifier for `algorithm` with `key` (the secret for HS256, a PEM
    /// public key otherwise), reading the user from `claim`.
    ///
    /// # Errors
    /// The PEM key cannot be read for that algorithm.
    pub fn new(algorithm: JwtAlgorithm, key: &[u8], claim: &str) -> Result<Self, String> {
        let (alg, key) = match algorithm {
            JwtAlgorithm::Hs256 => (Algorithm::HS256, DecodingKey::from_secret(key)),
            JwtAlgorithm::Rs256 => (
                Algorithm::RS256,
                DecodingKey::from_rsa_pem(key)
                    .map_err(|e| format!("not an RSA public key in PEM: {e}"))?,
            ),
            JwtAlgorithm::Es256 => (
                Algorithm::ES256,
                DecodingKey::from_ec_pem(key)
                    .map_err(|e| format!("not an EC public key in PEM: {e}"))?,
            ),
        };
        let mut validation = Validation::new(alg);
        validation.leeway = LEEWAY_SECS;
        validation.validate_nbf = true;
        // No audience is configured: an `aud` claim is not a reason to refuse.
        validation.validate_aud = false;
        Ok(Self {
            key: Arc::new(key),
            validation: Arc::new(validation),
            claim: Arc::from(claim),
            plan_claim: None,
            rejected: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The same verifier, also reading the caller's plan from `claim`.
    #[must_use]
    pub fn with_plan_claim(mut self, claim: &str) -> Self {
        self.plan_claim = Some(Arc::from(claim));
        self
    }

    /// The user named by a valid `token`, or `None` (logged and counted).
    pub fn user(&self, token: &[u8]) -> Option<Vec<u8>> {
        self.verify(token).user
    }

    /// The user and plan a valid `token` names, verified once. A token
    /// that does not verify, or names no user, is logged and counted; a
    /// missing plan claim is not a refusal (the caller gets the plan of
    /// unknown callers).
    pub fn verify(&self, token: &[u8]) -> Verified {
        let claims = match decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            &self.key,
            &self.validation,
        ) {
            Ok(data) => data.claims,
            Err(e) => {
                self.refuse(&e.to_string());
                return Verified::default();
            }
        };
        let user = text(claims.get(&*self.claim));
        if user.is_none() {
            self.refuse(&format!("claim {:?} missing or not a string", self.claim));
        }
        let plan = self.plan_claim.as_deref().and_then(|c| text(claims.get(c)));
        Verified { user, plan }
    }

    /// The name of the plan claim, when one is read.
    pub fn plan_claim(&self) -> Option<&str> {
        self.plan_claim.as_deref()
    }

    /// Tokens refused so far.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    fn refuse(&self, why: &str) {
        let n = self.rejected.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            warn!(
                rejected_total = n,
                reason = why,
                "JWT not accepted; the request has no user identity"
            );
        }
    }
}

/// A claim as identity text: a non-empty string, or a number's digits.
fn text(value: Option<&serde_json::Value>) -> Option<Vec<u8>> {
    match value {
        Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.as_bytes().to_vec()),
        Some(serde_json::Value::Number(n)) => Some(n.to_string().into_bytes()),
        _ => None,
    }
}

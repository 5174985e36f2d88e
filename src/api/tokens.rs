//! Job-scoped attach tokens: what a submit returns so a browser can open the
//! job's stream without ever holding the API key.
//!
//! A token is `<job id>.<expiry>.<signature>`: `expiry` in unix seconds,
//! `signature` the unpadded base64url HMAC-SHA256 of `<job id>|<expiry>`. It
//! is valid for that one job until it expires. The job id travels in clear
//! (the holder knows it anyway) so a genuine token presented for another job
//! is told apart from a forged one (403, not 401). Tokens of the first form,
//! `<expiry>.<signature>`, are still accepted for the job they were signed
//! for. Every API replica must sign with the same secret: a configured one,
//! or else one generated once and shared through Redis.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::queue::{Queue, QueueError};

type HmacSha256 = Hmac<Sha256>;

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the attach token has expired")]
    Expired,
    #[error("the attach token is not valid")]
    Invalid,
    /// Genuine, but signed for another job.
    #[error("the attach token is for another job")]
    OtherJob,
}

/// Signs and checks attach tokens.
#[derive(Clone)]
pub struct TokenSigner {
    /// HMAC-SHA256 keyed with the secret, cloned for each token.
    keyed: HmacSha256,
    ttl: Duration,
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSigner")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// 32 random bytes as hex, from the OS generator (through `uuid`'s v4,
/// hashed together: 244 random bits).
fn random_secret() -> String {
    let mut hasher = Sha256::new();
    hasher.update(uuid::Uuid::new_v4().as_bytes());
    hasher.update(uuid::Uuid::new_v4().as_bytes());
    hex::encode(hasher.finalize())
}

impl TokenSigner {
    /// A signer with a known secret.
    pub fn new(secret: &[u8], ttl: Duration) -> Self {
        let keyed = match <HmacSha256 as KeyInit>::new_from_slice(secret) {
            Ok(keyed) => keyed,
            // HMAC pads or hashes a key of any length; the error type exists
            // only for MACs with fixed key sizes.
            Err(_) => unreachable!("HMAC accepts keys of any length"),
        };
        Self { keyed, ttl }
    }

    /// The configured secret, or else the one every replica shares through
    /// Redis (stored by whichever replica came first). An empty configured
    /// secret counts as none.
    pub async fn from_config(
        secret: Option<&str>,
        queue: &Queue,
        ttl: Duration,
    ) -> Result<Self, QueueError> {
        let secret = match secret.filter(|s| !s.is_empty()) {
            Some(secret) => secret.to_string(),
            None => queue.shared_token_secret(&random_secret()).await?,
        };
        Ok(Self::new(secret.as_bytes(), ttl))
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn mac(&self, job_id: &str, expiry: u64) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(job_id.as_bytes());
        mac.update(b"|");
        mac.update(expiry.to_string().as_bytes());
        mac
    }

    /// A token for `job_id`, valid for the configured time from now.
    pub fn sign(&self, job_id: &str) -> String {
        self.sign_until(job_id, now_secs().saturating_add(self.ttl.as_secs()))
    }

    fn sign_until(&self, job_id: &str, expiry: u64) -> String {
        let signature = self.mac(job_id, expiry).finalize().into_bytes();
        format!("{job_id}.{expiry}.{}", URL_SAFE_NO_PAD.encode(signature))
    }

    /// Checks a token for `job_id`: the signature first (in constant time),
    /// then the job it names, then the expiry, so only a genuine token is
    /// ever called expired or another job's.
    pub fn verify(&self, job_id: &str, token: &str) -> Result<(), TokenError> {
        self.verify_at(job_id, token, now_secs())
    }

    fn verify_at(&self, job_id: &str, token: &str, now: u64) -> Result<(), TokenError> {
        let mut parts = token.rsplitn(3, '.');
        let signature = parts.next().ok_or(TokenError::Invalid)?;
        let expiry_text = parts.next().ok_or(TokenError::Invalid)?;
        // The first form names no job: it can only be checked against this one.
        let signed_for = parts.next().unwrap_or(job_id);
        if expiry_text.is_empty() || !expiry_text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(TokenError::Invalid);
        }
        let expiry: u64 = expiry_text.parse().map_err(|_| TokenError::Invalid)?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| TokenError::Invalid)?;
        self.mac(signed_for, expiry)
            .verify_slice(&signature)
            .map_err(|_| TokenError::Invalid)?;
        if signed_for != job_id {
            return Err(TokenError::OtherJob);
        }
        if expiry <= now {
            return Err(TokenError::Expired);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = "3f1c0b8e-0000-4000-8000-000000000001";
    const OTHER: &str = "3f1c0b8e-0000-4000-8000-000000000002";

    fn signer() -> TokenSigner {
        TokenSigner::new(b"0123456789abcdef0123456789abcdef", Duration::from_secs(60))
    }

    #[test]
    fn a_token_is_valid_for_its_job_only() {
        let signer = signer();
        let token = signer.sign(JOB);
        assert_eq!(signer.verify(JOB, &token), Ok(()));
        assert_eq!(signer.verify(OTHER, &token), Err(TokenError::OtherJob));
        let (job, rest) = token.split_once('.').unwrap();
        assert_eq!(job, JOB);
        let (expiry, signature) = rest.split_once('.').unwrap();
        let expiry: u64 = expiry.parse().unwrap();
        assert!(expiry >= now_secs() + 59 && expiry <= now_secs() + 60);
        assert_eq!(signature.len(), 43);
        assert!(!signature.contains(['+', '/', '=']));
    }

    #[test]
    fn expiry_is_checked_after_the_signature() {
        let signer = signer();
        let token = signer.sign_until(JOB, 1000);
        assert_eq!(signer.verify_at(JOB, &token, 999), Ok(()));
        assert_eq!(
            signer.verify_at(JOB, &token, 1000),
            Err(TokenError::Expired)
        );
        // Moving the expiry forward breaks the signature.
        let forged = token.replacen(".1000.", ".9999.", 1);
        assert_eq!(
            signer.verify_at(JOB, &forged, 1000),
            Err(TokenError::Invalid)
        );
        // So does naming another job.
        let forged = token.replacen(JOB, OTHER, 1);
        assert_eq!(
            signer.verify_at(OTHER, &forged, 999),
            Err(TokenError::Invalid)
        );
        // Another job's genuine token is told apart, expired or not.
        assert_eq!(
            signer.verify_at(OTHER, &token, 2000),
            Err(TokenError::OtherJob)
        );
    }

    #[test]
    fn tokens_of_the_first_form_still_verify() {
        let signer = signer();
        let signature = URL_SAFE_NO_PAD.encode(signer.mac(JOB, 1000).finalize().into_bytes());
        let token = format!("1000.{signature}");
        assert_eq!(signer.verify_at(JOB, &token, 999), Ok(()));
        assert_eq!(
            signer.verify_at(JOB, &token, 1000),
            Err(TokenError::Expired)
        );
        assert_eq!(
            signer.verify_at(OTHER, &token, 999),
            Err(TokenError::Invalid)
        );
    }

    #[test]
    fn another_secret_or_garbage_is_invalid() {
        let token = signer().sign(JOB);
        let other = TokenSigner::new(b"another secret", Duration::from_secs(60));
        assert_eq!(other.verify(JOB, &token), Err(TokenError::Invalid));
        for garbage in [
            "",
            ".",
            "abc",
            "123.",
            ".abc",
            "+1.abc",
            "12x.abc",
            "99999999999999999999999.abc",
            "123.!!!",
            "a.b.c.d",
            "x..abc",
        ] {
            assert_eq!(
                signer().verify(JOB, garbage),
                Err(TokenError::Invalid),
                "{garbage:?}"
            );
        }
    }

    #[test]
    fn random_secrets_differ() {
        let a = random_secret();
        assert_eq!(a.len(), 64);
        assert_ne!(a, random_secret());
    }
}

//! Claims on registrations: the replica that fits a registration holds
//! `claims/<task id>.json`, naming itself and a time one lease ahead, and
//! renews it four times a lease; a claim not renewed in time is taken
//! over by another replica (`docs/design/task-store.md`, "Registrations
//! across the fleet").

use super::objects::{Fault, Got, Write};
use super::{now_ms, Claim, Shared, StoreError};

impl Shared {
    fn claim_name(id: &str) -> String {
        format!("claims/{id}.json")
    }

    fn claim_bytes(&self, id: &str) -> Vec<u8> {
        serde_json::to_vec(&Claim {
            task: id.to_string(),
            owner: self.replica.clone(),
            expires_ms: now_ms() + self.settings.lease.as_millis() as u64,
        })
        .unwrap_or_default()
    }

    /// Claims the fit of registration `id`: when no replica holds it, or
    /// the one that held it let its lease run out. Whether this replica
    /// holds it now.
    pub fn claim(&self, id: &str) -> Result<bool, StoreError> {
        let name = Self::claim_name(id);
        let how = match self
            .objects
            .get(&name, None)
            .map_err(|f| StoreError::of(&self.label, "be read", f))?
        {
            Got::Missing | Got::Unchanged => Write::Create,
            Got::Found { bytes, tag } => {
                let held: Option<Claim> = serde_json::from_slice(&bytes).ok();
                match held {
                    Some(c) if c.owner == self.replica => Write::Update(tag),
                    Some(c) if c.expires_ms > now_ms() => return Ok(false),
                    _ => Write::Update(tag),
                }
            }
        };
        match self.objects.put(&name, &self.claim_bytes(id), how) {
            Ok(tag) => {
                self.claims().insert(id.to_string(), tag);
                Ok(true)
            }
            Err(Fault::Exists | Fault::Stale) => Ok(false),
            Err(f) => Err(StoreError::of(&self.label, "be written", f)),
        }
    }

    /// Renews this replica's claims; the ids of those it lost (another
    /// replica took them over after the lease ran out).
    pub fn renew(&self) -> Vec<String> {
        let held: Vec<String> = self.claims().keys().cloned().collect();
        held.into_iter()
            .filter(|id| self.renew_one(id) == Some(false))
            .collect()
    }

    /// Renews the claim on `id` now: whether this replica still holds it
    /// (a registration's result is written only by its claim's holder).
    pub fn confirm(&self, id: &str) -> bool {
        self.renew_one(id).unwrap_or(false)
    }

    /// Renews the claim on `id`: `None` when this replica does not hold
    /// it, else whether it still does. One renewal at a time, so that two
    /// of this replica's never race each other over the claim's version.
    fn renew_one(&self, id: &str) -> Option<bool> {
        let _one = self.renewing.lock().unwrap_or_else(|p| p.into_inner());
        let tag = self.claims().get(id).cloned()?;
        match self.objects.put(
            &Self::claim_name(id),
            &self.claim_bytes(id),
            Write::Update(tag),
        ) {
            Ok(tag) => {
                self.claims().insert(id.to_string(), tag);
                Some(true)
            }
            Err(Fault::Stale | Fault::Exists) => {
                self.claims().remove(id);
                Some(false)
            }
            // Unknown: the lease has not run out yet, so it is still held
            // (renewed again at the next turn, several turns a lease).
            Err(Fault::Unavailable(_)) => Some(true),
        }
    }

    /// Whether this replica holds the claim on `id`.
    pub fn holds(&self, id: &str) -> bool {
        self.claims().contains_key(id)
    }

    /// Gives the claim on `id` up (the registration is finished or gone).
    pub fn release(&self, id: &str) {
        // Not while it is being renewed (the renewal would find it gone
        // and take it for lost).
        let _one = self.renewing.lock().unwrap_or_else(|p| p.into_inner());
        if self.claims().remove(id).is_some() {
            let _ = self.objects.delete(&Self::claim_name(id));
        }
    }
}

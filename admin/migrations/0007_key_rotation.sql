-- Automatic rotation of API keys (their rotation_policy). Portable SQL, as in 0001: times are
-- RFC 3339 UTC text of fixed width, so they compare as text on both databases.
--
-- next_rotation_at: the policy's next_rotation_at, kept beside the JSON document so that the
-- rotation worker finds due keys by index, and so that two instances rotating at once can
-- update a key on the condition that it is still the value they read (only one wins). Keys
-- made before this migration get it from their policy when it is applied (db.rs).
-- rotated_key: the raw key an automatic rotation made, encrypted with the secret key (as
-- integration secrets are; bound to the key's row), until its owner fetches it once with
-- GET /v1/api-keys/{id}/rotated-key; rotated_key_at: when that rotation happened. A later
-- rotation replaces a key nobody fetched.

ALTER TABLE api_keys ADD COLUMN next_rotation_at TEXT;
ALTER TABLE api_keys ADD COLUMN rotated_key TEXT;
ALTER TABLE api_keys ADD COLUMN rotated_key_at TEXT;
CREATE INDEX api_keys_rotation ON api_keys (next_rotation_at);

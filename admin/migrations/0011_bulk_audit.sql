-- A bulk action (creating many API keys or providers in one call) is audited as one record
-- that names every item it made: resource_ids is a JSON list of their ids, NULL otherwise.
ALTER TABLE audit_logs ADD COLUMN resource_ids TEXT;

-- The models of an integration (GET/PUT /v1/integrations/{slug}/models): whether each is
-- enabled, and its custom price. Portable SQL, as in 0001: ids and times are text, booleans
-- are 0/1 integers.
--
-- slug is the model id as the client wrote it; slug_key is it in lowercase, so that one model
-- has one row however it is spelt (model ids compare case-insensitively, as in the price
-- table). Prices are US dollars per million input and output tokens: both set, or both NULL
-- (no custom price). The data plane prices requests through the integration's providers with
-- them before any price table.
CREATE TABLE integration_models (
    integration_id TEXT NOT NULL REFERENCES integrations (id) ON DELETE CASCADE,
    slug_key TEXT NOT NULL,
    slug TEXT NOT NULL,
    enabled BIGINT NOT NULL CHECK (enabled IN (0, 1)),
    input_per_million DOUBLE PRECISION CHECK (input_per_million >= 0),
    output_per_million DOUBLE PRECISION CHECK (output_per_million >= 0),
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL,
    PRIMARY KEY (integration_id, slug_key),
    CHECK ((input_per_million IS NULL) = (output_per_million IS NULL))
);

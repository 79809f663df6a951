-- Every statement tenure's SQLite store sends, for every binding (table).
-- Rendered by tests/support/sql_renderings.py; do not edit by hand:
--   .venv/bin/python -P tests/support/sql_renderings.py --write
-- Locking: a write transaction (BEGIN IMMEDIATE) holds the database's write lock; the clock is the tenure_clock high-water mark, read after it.
-- Parameters are :name; :now is the transaction's clock.


-- ==== queue.validation_jobs (table validation_jobs) ====

-- insert: a new row, returned as stored
INSERT INTO validation_jobs (id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json) VALUES (:id, :contract_name, :contract_version, :data_json, :status, :fires_at, :claimed_by, :claimed_at, :lease_expires_at, :dlq_record_id, :attempt, :max_attempts, :error_message, :idempotency_key, :created_at, :completed_at, :result_json, :generation, :claim_token, :submission_id, :fingerprint, :fence_required, :authored_json) RETURNING id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- update: compare-and-set of one row (every mutable column as decided on), returned as written
UPDATE validation_jobs SET status = :status, fires_at = :fires_at, claimed_by = :claimed_by, claimed_at = :claimed_at, lease_expires_at = :lease_expires_at, dlq_record_id = :dlq_record_id, attempt = :attempt, error_message = :error_message, completed_at = :completed_at, result_json = :result_json, generation = :generation, claim_token = :claim_token WHERE id = :old_key AND status IS :old_status AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND dlq_record_id IS :old_dlq_record_id AND attempt IS :old_attempt AND error_message IS :old_error_message AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token RETURNING id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- update_seen: compare-and-set of one row decided on as last seen, not read in this transaction (every column), returned as written
UPDATE validation_jobs SET status = :status, fires_at = :fires_at, claimed_by = :claimed_by, claimed_at = :claimed_at, lease_expires_at = :lease_expires_at, dlq_record_id = :dlq_record_id, attempt = :attempt, error_message = :error_message, completed_at = :completed_at, result_json = :result_json, generation = :generation, claim_token = :claim_token WHERE id = :old_key AND contract_name IS :old_contract_name AND contract_version IS :old_contract_version AND data_json IS :old_data_json AND status IS :old_status AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND dlq_record_id IS :old_dlq_record_id AND attempt IS :old_attempt AND max_attempts IS :old_max_attempts AND error_message IS :old_error_message AND idempotency_key IS :old_idempotency_key AND created_at IS :old_created_at AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token AND submission_id IS :old_submission_id AND fingerprint IS :old_fingerprint AND fence_required IS :old_fence_required AND authored_json IS :old_authored_json RETURNING id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- delete: compare-and-set delete of one row
DELETE FROM validation_jobs WHERE id = :old_key AND status IS :old_status AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND dlq_record_id IS :old_dlq_record_id AND attempt IS :old_attempt AND error_message IS :old_error_message AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token RETURNING id;

-- read_keys: the rows with these keys as they are (no lock, no clock)
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE id IN (SELECT value FROM json_each(:keys)) ORDER BY id;

-- set_aside: a row a claim cannot read, set aside by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
UPDATE validation_jobs SET status = :set_status, lease_expires_at = :set_lease_expires_at, completed_at = :set_completed_at, error_message = :set_error_message WHERE id = :set_aside_key AND ((status IN ('pending', 'claimed'))) RETURNING 1;

-- set_aside by stored bytes: a row a claim cannot read, set aside by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
UPDATE validation_jobs SET status = :set_status, lease_expires_at = :set_lease_expires_at, completed_at = :set_completed_at, error_message = :set_error_message WHERE CAST(id AS BLOB) = :set_aside_key AND ((status IN ('pending', 'claimed'))) RETURNING 1;

-- delete_unreadable: a finished row retention selected but cannot read, deleted by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
DELETE FROM validation_jobs WHERE id = :unreadable_key AND ((status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3)) RETURNING 1;

-- delete_unreadable by stored bytes: a finished row retention selected but cannot read, deleted by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
DELETE FROM validation_jobs WHERE CAST(id AS BLOB) = :unreadable_key AND ((status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3)) RETURNING 1;

-- find queue.by_keys: lock wait
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (id IN (SELECT value FROM json_each(:keys))) ORDER BY id;

-- find queue.by_token: lock wait
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (claim_token = :claim_token);

-- find queue.tokens_stored: lock none
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (claim_token IN (SELECT value FROM json_each(:tokens)));

-- find queue.eligible: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts) ORDER BY fires_at, id LIMIT :limit;

-- find queue.eligible_legacy: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND fence_required = :c4) ORDER BY fires_at, id LIMIT :limit;

-- find queue.claimable: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND generation < 9223372036854775807) ORDER BY fires_at, id LIMIT :limit;

-- find queue.claimable_legacy: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND fence_required = :c4 AND generation < 9223372036854775807) ORDER BY fires_at, id LIMIT :limit;

-- find queue.expired: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (status = 'claimed' AND lease_expires_at <= :now) ORDER BY lease_expires_at, id LIMIT :limit;

-- find queue.set_aside_guard: lock none
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (status IN ('pending', 'claimed'));

-- find queue.finished_before: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3) ORDER BY completed_at, id LIMIT :limit;

-- find queue.finished_before_with_status: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (status = :status AND completed_at < :cutoff AND fence_required = :c3) ORDER BY completed_at, id LIMIT :limit;

-- find queue.all_rows: lock none
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs ORDER BY created_at, id;

-- find queue.with_status: lock none
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (status = :status) ORDER BY created_at, id;

-- find queue.located_batch: lock wait
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (submission_id IN (SELECT value FROM json_each(:submission_ids))) OR (id IN (SELECT value FROM json_each(:keys))) ORDER BY id;

-- find queue.locate(VALIDATION): lock wait
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM validation_jobs WHERE (submission_id = :submission_id) OR (id = :job_id) OR (idempotency_key = :key) ORDER BY id;


-- ==== queue.pipeline_jobs (table pipeline_jobs) ====

-- insert: a new row, returned as stored
INSERT INTO pipeline_jobs (id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json) VALUES (:id, :run_id, :status, :payload_json, :fires_at, :claimed_by, :claimed_at, :lease_expires_at, :dlq_record_id, :attempt, :max_attempts, :idempotency_key, :error_message, :created_at, :completed_at, :result_json, :generation, :claim_token, :submission_id, :fingerprint, :fence_required, :authored_json) RETURNING id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- update: compare-and-set of one row (every mutable column as decided on), returned as written
UPDATE pipeline_jobs SET status = :status, fires_at = :fires_at, claimed_by = :claimed_by, claimed_at = :claimed_at, lease_expires_at = :lease_expires_at, dlq_record_id = :dlq_record_id, attempt = :attempt, error_message = :error_message, completed_at = :completed_at, result_json = :result_json, generation = :generation, claim_token = :claim_token WHERE id = :old_key AND status IS :old_status AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND dlq_record_id IS :old_dlq_record_id AND attempt IS :old_attempt AND error_message IS :old_error_message AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token RETURNING id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- update_seen: compare-and-set of one row decided on as last seen, not read in this transaction (every column), returned as written
UPDATE pipeline_jobs SET status = :status, fires_at = :fires_at, claimed_by = :claimed_by, claimed_at = :claimed_at, lease_expires_at = :lease_expires_at, dlq_record_id = :dlq_record_id, attempt = :attempt, error_message = :error_message, completed_at = :completed_at, result_json = :result_json, generation = :generation, claim_token = :claim_token WHERE id = :old_key AND run_id IS :old_run_id AND status IS :old_status AND payload_json IS :old_payload_json AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND dlq_record_id IS :old_dlq_record_id AND attempt IS :old_attempt AND max_attempts IS :old_max_attempts AND idempotency_key IS :old_idempotency_key AND error_message IS :old_error_message AND created_at IS :old_created_at AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token AND submission_id IS :old_submission_id AND fingerprint IS :old_fingerprint AND fence_required IS :old_fence_required AND authored_json IS :old_authored_json RETURNING id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- delete: compare-and-set delete of one row
DELETE FROM pipeline_jobs WHERE id = :old_key AND status IS :old_status AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND dlq_record_id IS :old_dlq_record_id AND attempt IS :old_attempt AND error_message IS :old_error_message AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token RETURNING id;

-- read_keys: the rows with these keys as they are (no lock, no clock)
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE id IN (SELECT value FROM json_each(:keys)) ORDER BY id;

-- set_aside: a row a claim cannot read, set aside by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
UPDATE pipeline_jobs SET status = :set_status, lease_expires_at = :set_lease_expires_at, completed_at = :set_completed_at, error_message = :set_error_message WHERE id = :set_aside_key AND ((status IN ('pending', 'claimed'))) RETURNING 1;

-- set_aside by stored bytes: a row a claim cannot read, set aside by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
UPDATE pipeline_jobs SET status = :set_status, lease_expires_at = :set_lease_expires_at, completed_at = :set_completed_at, error_message = :set_error_message WHERE CAST(id AS BLOB) = :set_aside_key AND ((status IN ('pending', 'claimed'))) RETURNING 1;

-- delete_unreadable: a finished row retention selected but cannot read, deleted by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
DELETE FROM pipeline_jobs WHERE id = :unreadable_key AND ((status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3)) RETURNING 1;

-- delete_unreadable by stored bytes: a finished row retention selected but cannot read, deleted by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
DELETE FROM pipeline_jobs WHERE CAST(id AS BLOB) = :unreadable_key AND ((status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3)) RETURNING 1;

-- find queue.by_keys: lock wait
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (id IN (SELECT value FROM json_each(:keys))) ORDER BY id;

-- find queue.by_token: lock wait
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (claim_token = :claim_token);

-- find queue.tokens_stored: lock none
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (claim_token IN (SELECT value FROM json_each(:tokens)));

-- find queue.eligible: lock skip
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts) ORDER BY fires_at, id LIMIT :limit;

-- find queue.eligible_legacy: lock skip
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND fence_required = :c4) ORDER BY fires_at, id LIMIT :limit;

-- find queue.claimable: lock skip
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND generation < 9223372036854775807) ORDER BY fires_at, id LIMIT :limit;

-- find queue.claimable_legacy: lock skip
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND fence_required = :c4 AND generation < 9223372036854775807) ORDER BY fires_at, id LIMIT :limit;

-- find queue.expired: lock skip
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (status = 'claimed' AND lease_expires_at <= :now) ORDER BY lease_expires_at, id LIMIT :limit;

-- find queue.set_aside_guard: lock none
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (status IN ('pending', 'claimed'));

-- find queue.finished_before: lock skip
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3) ORDER BY completed_at, id LIMIT :limit;

-- find queue.finished_before_with_status: lock skip
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (status = :status AND completed_at < :cutoff AND fence_required = :c3) ORDER BY completed_at, id LIMIT :limit;

-- find queue.all_rows: lock none
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs ORDER BY created_at, id;

-- find queue.with_status: lock none
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (status = :status) ORDER BY created_at, id;

-- find queue.located_batch: lock wait
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (submission_id IN (SELECT value FROM json_each(:submission_ids))) OR (id IN (SELECT value FROM json_each(:keys))) ORDER BY id;

-- find queue.locate(PIPELINE): lock wait
SELECT id, run_id, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM pipeline_jobs WHERE (submission_id = :submission_id) OR (id = :job_id) OR (run_id = :run_id) OR (idempotency_key = :key) ORDER BY id;


-- ==== queue.streaming_jobs (table streaming_jobs) ====

-- insert: a new row, returned as stored
INSERT INTO streaming_jobs (id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json) VALUES (:id, :config_name, :config_version, :status, :payload_json, :fires_at, :claimed_by, :claimed_at, :lease_expires_at, :cancel_requested, :pid, :attempt, :max_attempts, :idempotency_key, :error_message, :created_at, :completed_at, :result_json, :generation, :claim_token, :submission_id, :fingerprint, :fence_required, :authored_json) RETURNING id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- update: compare-and-set of one row (every mutable column as decided on), returned as written
UPDATE streaming_jobs SET status = :status, fires_at = :fires_at, claimed_by = :claimed_by, claimed_at = :claimed_at, lease_expires_at = :lease_expires_at, cancel_requested = :cancel_requested, pid = :pid, attempt = :attempt, idempotency_key = :idempotency_key, error_message = :error_message, completed_at = :completed_at, result_json = :result_json, generation = :generation, claim_token = :claim_token WHERE id = :old_key AND status IS :old_status AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND cancel_requested IS :old_cancel_requested AND pid IS :old_pid AND attempt IS :old_attempt AND idempotency_key IS :old_idempotency_key AND error_message IS :old_error_message AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token RETURNING id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- update_seen: compare-and-set of one row decided on as last seen, not read in this transaction (every column), returned as written
UPDATE streaming_jobs SET status = :status, fires_at = :fires_at, claimed_by = :claimed_by, claimed_at = :claimed_at, lease_expires_at = :lease_expires_at, cancel_requested = :cancel_requested, pid = :pid, attempt = :attempt, idempotency_key = :idempotency_key, error_message = :error_message, completed_at = :completed_at, result_json = :result_json, generation = :generation, claim_token = :claim_token WHERE id = :old_key AND config_name IS :old_config_name AND config_version IS :old_config_version AND status IS :old_status AND payload_json IS :old_payload_json AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND cancel_requested IS :old_cancel_requested AND pid IS :old_pid AND attempt IS :old_attempt AND max_attempts IS :old_max_attempts AND idempotency_key IS :old_idempotency_key AND error_message IS :old_error_message AND created_at IS :old_created_at AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token AND submission_id IS :old_submission_id AND fingerprint IS :old_fingerprint AND fence_required IS :old_fence_required AND authored_json IS :old_authored_json RETURNING id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- delete: compare-and-set delete of one row
DELETE FROM streaming_jobs WHERE id = :old_key AND status IS :old_status AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND cancel_requested IS :old_cancel_requested AND pid IS :old_pid AND attempt IS :old_attempt AND idempotency_key IS :old_idempotency_key AND error_message IS :old_error_message AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token RETURNING id;

-- read_keys: the rows with these keys as they are (no lock, no clock)
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE id IN (SELECT value FROM json_each(:keys)) ORDER BY id;

-- set_aside: a row a claim cannot read, set aside by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
UPDATE streaming_jobs SET status = :set_status, lease_expires_at = :set_lease_expires_at, pid = :set_pid, cancel_requested = :set_cancel_requested, idempotency_key = :set_idempotency_key, completed_at = :set_completed_at, error_message = :set_error_message WHERE id = :set_aside_key AND ((status IN ('pending', 'claimed'))) RETURNING 1;

-- set_aside by stored bytes: a row a claim cannot read, set aside by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
UPDATE streaming_jobs SET status = :set_status, lease_expires_at = :set_lease_expires_at, pid = :set_pid, cancel_requested = :set_cancel_requested, idempotency_key = :set_idempotency_key, completed_at = :set_completed_at, error_message = :set_error_message WHERE CAST(id AS BLOB) = :set_aside_key AND ((status IN ('pending', 'claimed'))) RETURNING 1;

-- delete_unreadable: a finished row retention selected but cannot read, deleted by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
DELETE FROM streaming_jobs WHERE id = :unreadable_key AND ((status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3)) RETURNING 1;

-- delete_unreadable by stored bytes: a finished row retention selected but cannot read, deleted by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
DELETE FROM streaming_jobs WHERE CAST(id AS BLOB) = :unreadable_key AND ((status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3)) RETURNING 1;

-- find queue.by_keys: lock wait
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (id IN (SELECT value FROM json_each(:keys))) ORDER BY id;

-- find queue.by_token: lock wait
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (claim_token = :claim_token);

-- find queue.tokens_stored: lock none
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (claim_token IN (SELECT value FROM json_each(:tokens)));

-- find queue.eligible: lock skip
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts) ORDER BY fires_at, id LIMIT :limit;

-- find queue.eligible_legacy: lock skip
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND fence_required = :c4) ORDER BY fires_at, id LIMIT :limit;

-- find queue.claimable: lock skip
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND generation < 9223372036854775807) ORDER BY fires_at, id LIMIT :limit;

-- find queue.claimable_legacy: lock skip
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND fence_required = :c4 AND generation < 9223372036854775807) ORDER BY fires_at, id LIMIT :limit;

-- find queue.expired: lock skip
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (status = 'claimed' AND lease_expires_at <= :now) ORDER BY lease_expires_at, id LIMIT :limit;

-- find queue.set_aside_guard: lock none
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (status IN ('pending', 'claimed'));

-- find queue.finished_before: lock skip
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3) ORDER BY completed_at, id LIMIT :limit;

-- find queue.finished_before_with_status: lock skip
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (status = :status AND completed_at < :cutoff AND fence_required = :c3) ORDER BY completed_at, id LIMIT :limit;

-- find queue.all_rows: lock none
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs ORDER BY created_at, id;

-- find queue.with_status: lock none
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (status = :status) ORDER BY created_at, id;

-- find queue.located_batch: lock wait
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (submission_id IN (SELECT value FROM json_each(:submission_ids))) OR (id IN (SELECT value FROM json_each(:keys))) ORDER BY id;

-- find queue.locate(STREAMING): lock wait
SELECT id, config_name, config_version, status, payload_json, fires_at, claimed_by, claimed_at, lease_expires_at, cancel_requested, pid, attempt, max_attempts, idempotency_key, error_message, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM streaming_jobs WHERE (submission_id = :submission_id) OR (id = :job_id) OR (idempotency_key = :key) ORDER BY id;


-- ==== queue.tenure_run_hops (table tenure_run_hops) ====

-- insert: a new row, returned as stored
INSERT INTO tenure_run_hops (id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json) VALUES (:id, :contract_name, :contract_version, :data_json, :status, :fires_at, :claimed_by, :claimed_at, :lease_expires_at, :dlq_record_id, :attempt, :max_attempts, :error_message, :idempotency_key, :created_at, :completed_at, :result_json, :generation, :claim_token, :submission_id, :fingerprint, :fence_required, :authored_json) RETURNING id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- update: compare-and-set of one row (every mutable column as decided on), returned as written
UPDATE tenure_run_hops SET status = :status, fires_at = :fires_at, claimed_by = :claimed_by, claimed_at = :claimed_at, lease_expires_at = :lease_expires_at, dlq_record_id = :dlq_record_id, attempt = :attempt, error_message = :error_message, completed_at = :completed_at, result_json = :result_json, generation = :generation, claim_token = :claim_token WHERE id = :old_key AND status IS :old_status AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND dlq_record_id IS :old_dlq_record_id AND attempt IS :old_attempt AND error_message IS :old_error_message AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token RETURNING id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- update_seen: compare-and-set of one row decided on as last seen, not read in this transaction (every column), returned as written
UPDATE tenure_run_hops SET status = :status, fires_at = :fires_at, claimed_by = :claimed_by, claimed_at = :claimed_at, lease_expires_at = :lease_expires_at, dlq_record_id = :dlq_record_id, attempt = :attempt, error_message = :error_message, completed_at = :completed_at, result_json = :result_json, generation = :generation, claim_token = :claim_token WHERE id = :old_key AND contract_name IS :old_contract_name AND contract_version IS :old_contract_version AND data_json IS :old_data_json AND status IS :old_status AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND dlq_record_id IS :old_dlq_record_id AND attempt IS :old_attempt AND max_attempts IS :old_max_attempts AND error_message IS :old_error_message AND idempotency_key IS :old_idempotency_key AND created_at IS :old_created_at AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token AND submission_id IS :old_submission_id AND fingerprint IS :old_fingerprint AND fence_required IS :old_fence_required AND authored_json IS :old_authored_json RETURNING id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- delete: compare-and-set delete of one row
DELETE FROM tenure_run_hops WHERE id = :old_key AND status IS :old_status AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND dlq_record_id IS :old_dlq_record_id AND attempt IS :old_attempt AND error_message IS :old_error_message AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token RETURNING id;

-- read_keys: the rows with these keys as they are (no lock, no clock)
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE id IN (SELECT value FROM json_each(:keys)) ORDER BY id;

-- set_aside: a row a claim cannot read, set aside by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
UPDATE tenure_run_hops SET status = :set_status, lease_expires_at = :set_lease_expires_at, completed_at = :set_completed_at, error_message = :set_error_message WHERE id = :set_aside_key AND ((status IN ('pending', 'claimed'))) RETURNING 1;

-- set_aside by stored bytes: a row a claim cannot read, set aside by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
UPDATE tenure_run_hops SET status = :set_status, lease_expires_at = :set_lease_expires_at, completed_at = :set_completed_at, error_message = :set_error_message WHERE CAST(id AS BLOB) = :set_aside_key AND ((status IN ('pending', 'claimed'))) RETURNING 1;

-- delete_unreadable: a finished row retention selected but cannot read, deleted by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
DELETE FROM tenure_run_hops WHERE id = :unreadable_key AND ((status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3)) RETURNING 1;

-- delete_unreadable by stored bytes: a finished row retention selected but cannot read, deleted by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
DELETE FROM tenure_run_hops WHERE CAST(id AS BLOB) = :unreadable_key AND ((status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3)) RETURNING 1;

-- find queue.by_keys: lock wait
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE (id IN (SELECT value FROM json_each(:keys))) ORDER BY id;

-- find queue.by_token: lock wait
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE (claim_token = :claim_token);

-- find queue.tokens_stored: lock none
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE (claim_token IN (SELECT value FROM json_each(:tokens)));

-- find queue.eligible: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts) ORDER BY fires_at, id LIMIT :limit;

-- find queue.eligible_legacy: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND fence_required = :c4) ORDER BY fires_at, id LIMIT :limit;

-- find queue.claimable: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND generation < 9223372036854775807) ORDER BY fires_at, id LIMIT :limit;

-- find queue.claimable_legacy: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND fence_required = :c4 AND generation < 9223372036854775807) ORDER BY fires_at, id LIMIT :limit;

-- find queue.expired: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE (status = 'claimed' AND lease_expires_at <= :now) ORDER BY lease_expires_at, id LIMIT :limit;

-- find queue.set_aside_guard: lock none
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE (status IN ('pending', 'claimed'));

-- find queue.finished_before: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE (status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3) ORDER BY completed_at, id LIMIT :limit;

-- find queue.finished_before_with_status: lock skip
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE (status = :status AND completed_at < :cutoff AND fence_required = :c3) ORDER BY completed_at, id LIMIT :limit;

-- find queue.all_rows: lock none
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops ORDER BY created_at, id;

-- find queue.with_status: lock none
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE (status = :status) ORDER BY created_at, id;

-- find queue.located_batch: lock wait
SELECT id, contract_name, contract_version, data_json, status, fires_at, claimed_by, claimed_at, lease_expires_at, dlq_record_id, attempt, max_attempts, error_message, idempotency_key, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_run_hops WHERE (submission_id IN (SELECT value FROM json_each(:submission_ids))) OR (id IN (SELECT value FROM json_each(:keys))) ORDER BY id;


-- ==== queue.tenure_tasks (table tenure_tasks) ====

-- insert: a new row, returned as stored
INSERT INTO tenure_tasks (id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json) VALUES (:id, :queue_name, :task_name, :args_json, :priority, :status, :fires_at, :claimed_by, :claimed_at, :lease_expires_at, :attempt, :max_attempts, :retry_json, :error_message, :dlq_record_id, :progress_json, :created_at, :completed_at, :result_json, :generation, :claim_token, :submission_id, :fingerprint, :fence_required, :authored_json) RETURNING id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- update: compare-and-set of one row (every mutable column as decided on), returned as written
UPDATE tenure_tasks SET status = :status, fires_at = :fires_at, claimed_by = :claimed_by, claimed_at = :claimed_at, lease_expires_at = :lease_expires_at, attempt = :attempt, error_message = :error_message, dlq_record_id = :dlq_record_id, progress_json = :progress_json, completed_at = :completed_at, result_json = :result_json, generation = :generation, claim_token = :claim_token WHERE id = :old_key AND status IS :old_status AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND attempt IS :old_attempt AND error_message IS :old_error_message AND dlq_record_id IS :old_dlq_record_id AND progress_json IS :old_progress_json AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token RETURNING id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- update_seen: compare-and-set of one row decided on as last seen, not read in this transaction (every column), returned as written
UPDATE tenure_tasks SET status = :status, fires_at = :fires_at, claimed_by = :claimed_by, claimed_at = :claimed_at, lease_expires_at = :lease_expires_at, attempt = :attempt, error_message = :error_message, dlq_record_id = :dlq_record_id, progress_json = :progress_json, completed_at = :completed_at, result_json = :result_json, generation = :generation, claim_token = :claim_token WHERE id = :old_key AND queue_name IS :old_queue_name AND task_name IS :old_task_name AND args_json IS :old_args_json AND priority IS :old_priority AND status IS :old_status AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND attempt IS :old_attempt AND max_attempts IS :old_max_attempts AND retry_json IS :old_retry_json AND error_message IS :old_error_message AND dlq_record_id IS :old_dlq_record_id AND progress_json IS :old_progress_json AND created_at IS :old_created_at AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token AND submission_id IS :old_submission_id AND fingerprint IS :old_fingerprint AND fence_required IS :old_fence_required AND authored_json IS :old_authored_json RETURNING id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json;

-- delete: compare-and-set delete of one row
DELETE FROM tenure_tasks WHERE id = :old_key AND status IS :old_status AND fires_at IS :old_fires_at AND claimed_by IS :old_claimed_by AND claimed_at IS :old_claimed_at AND lease_expires_at IS :old_lease_expires_at AND attempt IS :old_attempt AND error_message IS :old_error_message AND dlq_record_id IS :old_dlq_record_id AND progress_json IS :old_progress_json AND completed_at IS :old_completed_at AND result_json IS :old_result_json AND generation IS :old_generation AND claim_token IS :old_claim_token RETURNING id;

-- read_keys: the rows with these keys as they are (no lock, no clock)
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE id IN (SELECT value FROM json_each(:keys)) ORDER BY id;

-- set_aside: a row a claim cannot read, set aside by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
UPDATE tenure_tasks SET status = :set_status, lease_expires_at = :set_lease_expires_at, completed_at = :set_completed_at, error_message = :set_error_message WHERE id = :set_aside_key AND ((status IN ('pending', 'claimed'))) RETURNING 1;

-- set_aside by stored bytes: a row a claim cannot read, set aside by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
UPDATE tenure_tasks SET status = :set_status, lease_expires_at = :set_lease_expires_at, completed_at = :set_completed_at, error_message = :set_error_message WHERE CAST(id AS BLOB) = :set_aside_key AND ((status IN ('pending', 'claimed'))) RETURNING 1;

-- delete_unreadable: a finished row retention selected but cannot read, deleted by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
DELETE FROM tenure_tasks WHERE id = :unreadable_key AND ((status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3)) RETURNING 1;

-- delete_unreadable by stored bytes: a finished row retention selected but cannot read, deleted by its stored key without reading it (specs/queue.md, 'Rows tenure cannot read')
DELETE FROM tenure_tasks WHERE CAST(id AS BLOB) = :unreadable_key AND ((status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3)) RETURNING 1;

-- find queue.by_keys: lock wait
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (id IN (SELECT value FROM json_each(:keys))) ORDER BY id;

-- find queue.by_token: lock wait
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (claim_token = :claim_token);

-- find queue.tokens_stored: lock none
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (claim_token IN (SELECT value FROM json_each(:tokens)));

-- find queue.eligible_tasks: lock skip
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND queue_name IN (SELECT value FROM json_each(:queues))) ORDER BY priority DESC, fires_at, id LIMIT :limit;

-- find queue.eligible_tasks_legacy: lock skip
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND fence_required = :c4 AND queue_name IN (SELECT value FROM json_each(:queues))) ORDER BY priority DESC, fires_at, id LIMIT :limit;

-- find queue.claimable_tasks: lock skip
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND queue_name IN (SELECT value FROM json_each(:queues)) AND generation < 9223372036854775807) ORDER BY priority DESC, fires_at, id LIMIT :limit;

-- find queue.claimable_tasks_legacy: lock skip
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND fence_required = :c4 AND queue_name IN (SELECT value FROM json_each(:queues)) AND generation < 9223372036854775807) ORDER BY priority DESC, fires_at, id LIMIT :limit;

-- find queue.eligible_task_queue: lock skip
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND queue_name = :queue) ORDER BY priority DESC, fires_at, id LIMIT :limit;

-- find queue.eligible_task_queue_legacy: lock skip
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND fence_required = :c4 AND queue_name = :queue) ORDER BY priority DESC, fires_at, id LIMIT :limit;

-- find queue.claimable_task_queue: lock skip
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND queue_name = :queue AND generation < 9223372036854775807) ORDER BY priority DESC, fires_at, id LIMIT :limit;

-- find queue.claimable_task_queue_legacy: lock skip
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (status = 'pending' AND fires_at <= :now AND attempt < max_attempts AND fence_required = :c4 AND queue_name = :queue AND generation < 9223372036854775807) ORDER BY priority DESC, fires_at, id LIMIT :limit;

-- find queue.expired: lock skip
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (status = 'claimed' AND lease_expires_at <= :now) ORDER BY lease_expires_at, id LIMIT :limit;

-- find queue.set_aside_guard: lock none
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (status IN ('pending', 'claimed'));

-- find queue.finished_before: lock skip
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (status IN ('completed', 'failed', 'cancelled') AND completed_at < :cutoff AND fence_required = :c3) ORDER BY completed_at, id LIMIT :limit;

-- find queue.finished_before_with_status: lock skip
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (status = :status AND completed_at < :cutoff AND fence_required = :c3) ORDER BY completed_at, id LIMIT :limit;

-- find queue.all_rows: lock none
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks ORDER BY created_at, id;

-- find queue.with_status: lock none
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (status = :status) ORDER BY created_at, id;

-- find queue.located_batch: lock wait
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (submission_id IN (SELECT value FROM json_each(:submission_ids))) OR (id IN (SELECT value FROM json_each(:keys))) ORDER BY id;

-- find queue.locate(TASK): lock wait
SELECT id, queue_name, task_name, args_json, priority, status, fires_at, claimed_by, claimed_at, lease_expires_at, attempt, max_attempts, retry_json, error_message, dlq_record_id, progress_json, created_at, completed_at, result_json, generation, claim_token, submission_id, fingerprint, fence_required, authored_json FROM tenure_tasks WHERE (submission_id = :submission_id) OR (id = :job_id) ORDER BY id;


-- ==== attempts (table tenure_attempts) ====

-- insert: a new row, returned as stored
INSERT INTO tenure_attempts (attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at) VALUES (:attempt_id, :envelope, :owner_job_id, :run_id, :station_attempt_id, :generation, :request_digest, :idempotency_key, :binding_json, :same_key_replay, :lookup, :target, :source_refs, :working_refs, :destination, :purpose, :consent_decision, :policy_revisions_json, :reservation, :spec_digest, :state, :provider_job_id, :transmissions, :transmission_egress, :denied_egress, :submit_lease_expires_at, :no_effect_proof_for, :granted_during_earlier_lease, :progress_cursor, :result_refs, :diagnostic_refs, :usage_json, :cost_json, :warnings, :cancel_requested, :evidence, :reservation_released, :created_at, :updated_at) RETURNING attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at;

-- update: compare-and-set of one row (every mutable column as decided on), returned as written
UPDATE tenure_attempts SET state = :state, provider_job_id = :provider_job_id, transmissions = :transmissions, transmission_egress = :transmission_egress, denied_egress = :denied_egress, submit_lease_expires_at = :submit_lease_expires_at, no_effect_proof_for = :no_effect_proof_for, granted_during_earlier_lease = :granted_during_earlier_lease, progress_cursor = :progress_cursor, result_refs = :result_refs, diagnostic_refs = :diagnostic_refs, usage_json = :usage_json, cost_json = :cost_json, warnings = :warnings, cancel_requested = :cancel_requested, evidence = :evidence, reservation_released = :reservation_released, updated_at = :updated_at WHERE attempt_id = :old_key AND state IS :old_state AND provider_job_id IS :old_provider_job_id AND transmissions IS :old_transmissions AND transmission_egress IS :old_transmission_egress AND denied_egress IS :old_denied_egress AND submit_lease_expires_at IS :old_submit_lease_expires_at AND no_effect_proof_for IS :old_no_effect_proof_for AND granted_during_earlier_lease IS :old_granted_during_earlier_lease AND progress_cursor IS :old_progress_cursor AND result_refs IS :old_result_refs AND diagnostic_refs IS :old_diagnostic_refs AND usage_json IS :old_usage_json AND cost_json IS :old_cost_json AND warnings IS :old_warnings AND cancel_requested IS :old_cancel_requested AND evidence IS :old_evidence AND reservation_released IS :old_reservation_released AND updated_at IS :old_updated_at RETURNING attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at;

-- update_seen: compare-and-set of one row decided on as last seen, not read in this transaction (every column), returned as written
UPDATE tenure_attempts SET state = :state, provider_job_id = :provider_job_id, transmissions = :transmissions, transmission_egress = :transmission_egress, denied_egress = :denied_egress, submit_lease_expires_at = :submit_lease_expires_at, no_effect_proof_for = :no_effect_proof_for, granted_during_earlier_lease = :granted_during_earlier_lease, progress_cursor = :progress_cursor, result_refs = :result_refs, diagnostic_refs = :diagnostic_refs, usage_json = :usage_json, cost_json = :cost_json, warnings = :warnings, cancel_requested = :cancel_requested, evidence = :evidence, reservation_released = :reservation_released, updated_at = :updated_at WHERE attempt_id = :old_key AND envelope IS :old_envelope AND owner_job_id IS :old_owner_job_id AND run_id IS :old_run_id AND station_attempt_id IS :old_station_attempt_id AND generation IS :old_generation AND request_digest IS :old_request_digest AND idempotency_key IS :old_idempotency_key AND binding_json IS :old_binding_json AND same_key_replay IS :old_same_key_replay AND lookup IS :old_lookup AND target IS :old_target AND source_refs IS :old_source_refs AND working_refs IS :old_working_refs AND destination IS :old_destination AND purpose IS :old_purpose AND consent_decision IS :old_consent_decision AND policy_revisions_json IS :old_policy_revisions_json AND reservation IS :old_reservation AND spec_digest IS :old_spec_digest AND state IS :old_state AND provider_job_id IS :old_provider_job_id AND transmissions IS :old_transmissions AND transmission_egress IS :old_transmission_egress AND denied_egress IS :old_denied_egress AND submit_lease_expires_at IS :old_submit_lease_expires_at AND no_effect_proof_for IS :old_no_effect_proof_for AND granted_during_earlier_lease IS :old_granted_during_earlier_lease AND progress_cursor IS :old_progress_cursor AND result_refs IS :old_result_refs AND diagnostic_refs IS :old_diagnostic_refs AND usage_json IS :old_usage_json AND cost_json IS :old_cost_json AND warnings IS :old_warnings AND cancel_requested IS :old_cancel_requested AND evidence IS :old_evidence AND reservation_released IS :old_reservation_released AND created_at IS :old_created_at AND updated_at IS :old_updated_at RETURNING attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at;

-- delete: compare-and-set delete of one row
DELETE FROM tenure_attempts WHERE attempt_id = :old_key AND state IS :old_state AND provider_job_id IS :old_provider_job_id AND transmissions IS :old_transmissions AND transmission_egress IS :old_transmission_egress AND denied_egress IS :old_denied_egress AND submit_lease_expires_at IS :old_submit_lease_expires_at AND no_effect_proof_for IS :old_no_effect_proof_for AND granted_during_earlier_lease IS :old_granted_during_earlier_lease AND progress_cursor IS :old_progress_cursor AND result_refs IS :old_result_refs AND diagnostic_refs IS :old_diagnostic_refs AND usage_json IS :old_usage_json AND cost_json IS :old_cost_json AND warnings IS :old_warnings AND cancel_requested IS :old_cancel_requested AND evidence IS :old_evidence AND reservation_released IS :old_reservation_released AND updated_at IS :old_updated_at RETURNING attempt_id;

-- read_keys: the rows with these keys as they are (no lock, no clock)
SELECT attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at FROM tenure_attempts WHERE attempt_id IN (SELECT value FROM json_each(:keys)) ORDER BY attempt_id;

-- find attempts.by_keys: lock wait
SELECT attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at FROM tenure_attempts WHERE (attempt_id IN (SELECT value FROM json_each(:keys))) ORDER BY attempt_id;

-- find attempts.of_owner_or_key: lock wait
SELECT attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at FROM tenure_attempts WHERE (owner_job_id = :owner_job_id) OR (idempotency_key = :key) ORDER BY attempt_id;

-- find attempts.all_attempts: lock none
SELECT attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at FROM tenure_attempts ORDER BY attempt_id;

-- find attempts.unresolved: lock none
SELECT attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at FROM tenure_attempts WHERE (state IN ('accepted', 'indeterminate', 'running', 'submitting')) ORDER BY created_at, attempt_id;

-- find attempts.unresolved_after: lock none
SELECT attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at FROM tenure_attempts WHERE (state IN ('accepted', 'indeterminate', 'running', 'submitting') AND created_at > :after_created) OR (state IN ('accepted', 'indeterminate', 'running', 'submitting') AND created_at = :after_created AND attempt_id > :after_id) ORDER BY created_at, attempt_id;

-- find runs.attempts_by_keys: lock none
SELECT attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at FROM tenure_attempts WHERE (attempt_id IN (SELECT value FROM json_each(:keys))) ORDER BY attempt_id;

-- find runs.open_attempts_of_run: lock none
SELECT attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at FROM tenure_attempts WHERE (run_id = :run_id AND state IN ('accepted', 'indeterminate', 'prepared', 'running', 'submitting')) ORDER BY attempt_id;

-- find runs.attempts_of_run: lock none
SELECT attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at FROM tenure_attempts WHERE (run_id = :run_id) ORDER BY attempt_id;

-- find runs.attempts_of_runs: lock none
SELECT attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at FROM tenure_attempts WHERE (run_id IN (SELECT value FROM json_each(:run_ids))) ORDER BY run_id, attempt_id;

-- find runs.open_attempts_of_runs: lock none
SELECT attempt_id, envelope, owner_job_id, run_id, station_attempt_id, generation, request_digest, idempotency_key, binding_json, same_key_replay, lookup, target, source_refs, working_refs, destination, purpose, consent_decision, policy_revisions_json, reservation, spec_digest, state, provider_job_id, transmissions, transmission_egress, denied_egress, submit_lease_expires_at, no_effect_proof_for, granted_during_earlier_lease, progress_cursor, result_refs, diagnostic_refs, usage_json, cost_json, warnings, cancel_requested, evidence, reservation_released, created_at, updated_at FROM tenure_attempts WHERE (run_id IN (SELECT value FROM json_each(:run_ids)) AND state IN ('accepted', 'indeterminate', 'prepared', 'running', 'submitting')) ORDER BY run_id, attempt_id;


-- ==== runs (table tenure_runs) ====

-- insert: a new row, returned as stored
INSERT INTO tenure_runs (run_id, status, session_id, source, principal, scopes, payload_json, requested_priority, intent_digest, idempotency_key, queue_name, priority, workflow_name, workflow_revision, workflow_digest, enqueue_seq, started_at, node, owner_kind, owner_id, error, created_at, updated_at, admitted_node, result_json, max_hop_retries, hop_retries, retry_of, wake_at, deadline) VALUES (:run_id, :status, :session_id, :source, :principal, :scopes, :payload_json, :requested_priority, :intent_digest, :idempotency_key, :queue_name, :priority, :workflow_name, :workflow_revision, :workflow_digest, :enqueue_seq, :started_at, :node, :owner_kind, :owner_id, :error, :created_at, :updated_at, :admitted_node, :result_json, :max_hop_retries, :hop_retries, :retry_of, :wake_at, :deadline) RETURNING run_id, status, session_id, source, principal, scopes, payload_json, requested_priority, intent_digest, idempotency_key, queue_name, priority, workflow_name, workflow_revision, workflow_digest, enqueue_seq, started_at, node, owner_kind, owner_id, error, created_at, updated_at, admitted_node, result_json, max_hop_retries, hop_retries, retry_of, wake_at, deadline;

-- update: compare-and-set of one row (every mutable column as decided on), returned as written
UPDATE tenure_runs SET status = :status, enqueue_seq = :enqueue_seq, started_at = :started_at, node = :node, owner_kind = :owner_kind, owner_id = :owner_id, error = :error, updated_at = :updated_at, result_json = :result_json, hop_retries = :hop_retries, wake_at = :wake_at WHERE run_id = :old_key AND status IS :old_status AND enqueue_seq IS :old_enqueue_seq AND started_at IS :old_started_at AND node IS :old_node AND owner_kind IS :old_owner_kind AND owner_id IS :old_owner_id AND error IS :old_error AND updated_at IS :old_updated_at AND result_json IS :old_result_json AND hop_retries IS :old_hop_retries AND wake_at IS :old_wake_at RETURNING run_id, status, session_id, source, principal, scopes, payload_json, requested_priority, intent_digest, idempotency_key, queue_name, priority, workflow_name, workflow_revision, workflow_digest, enqueue_seq, started_at, node, owner_kind, owner_id, error, created_at, updated_at, admitted_node, result_json, max_hop_retries, hop_retries, retry_of, wake_at, deadline;

-- update_seen: compare-and-set of one row decided on as last seen, not read in this transaction (every column), returned as written
UPDATE tenure_runs SET status = :status, enqueue_seq = :enqueue_seq, started_at = :started_at, node = :node, owner_kind = :owner_kind, owner_id = :owner_id, error = :error, updated_at = :updated_at, result_json = :result_json, hop_retries = :hop_retries, wake_at = :wake_at WHERE run_id = :old_key AND status IS :old_status AND session_id IS :old_session_id AND source IS :old_source AND principal IS :old_principal AND scopes IS :old_scopes AND payload_json IS :old_payload_json AND requested_priority IS :old_requested_priority AND intent_digest IS :old_intent_digest AND idempotency_key IS :old_idempotency_key AND queue_name IS :old_queue_name AND priority IS :old_priority AND workflow_name IS :old_workflow_name AND workflow_revision IS :old_workflow_revision AND workflow_digest IS :old_workflow_digest AND enqueue_seq IS :old_enqueue_seq AND started_at IS :old_started_at AND node IS :old_node AND owner_kind IS :old_owner_kind AND owner_id IS :old_owner_id AND error IS :old_error AND created_at IS :old_created_at AND updated_at IS :old_updated_at AND admitted_node IS :old_admitted_node AND result_json IS :old_result_json AND max_hop_retries IS :old_max_hop_retries AND hop_retries IS :old_hop_retries AND retry_of IS :old_retry_of AND wake_at IS :old_wake_at AND deadline IS :old_deadline RETURNING run_id, status, session_id, source, principal, scopes, payload_json, requested_priority, intent_digest, idempotency_key, queue_name, priority, workflow_name, workflow_revision, workflow_digest, enqueue_seq, started_at, node, owner_kind, owner_id, error, created_at, updated_at, admitted_node, result_json, max_hop_retries, hop_retries, retry_of, wake_at, deadline;

-- delete: compare-and-set delete of one row
DELETE FROM tenure_runs WHERE run_id = :old_key AND status IS :old_status AND enqueue_seq IS :old_enqueue_seq AND started_at IS :old_started_at AND node IS :old_node AND owner_kind IS :old_owner_kind AND owner_id IS :old_owner_id AND error IS :old_error AND updated_at IS :old_updated_at AND result_json IS :old_result_json AND hop_retries IS :old_hop_retries AND wake_at IS :old_wake_at RETURNING run_id;

-- read_keys: the rows with these keys as they are (no lock, no clock)
SELECT run_id, status, session_id, source, principal, scopes, payload_json, requested_priority, intent_digest, idempotency_key, queue_name, priority, workflow_name, workflow_revision, workflow_digest, enqueue_seq, started_at, node, owner_kind, owner_id, error, created_at, updated_at, admitted_node, result_json, max_hop_retries, hop_retries, retry_of, wake_at, deadline FROM tenure_runs WHERE run_id IN (SELECT value FROM json_each(:keys)) ORDER BY run_id;

-- find runs.runs_by_keys: lock wait
SELECT run_id, status, session_id, source, principal, scopes, payload_json, requested_priority, intent_digest, idempotency_key, queue_name, priority, workflow_name, workflow_revision, workflow_digest, enqueue_seq, started_at, node, owner_kind, owner_id, error, created_at, updated_at, admitted_node, result_json, max_hop_retries, hop_retries, retry_of, wake_at, deadline FROM tenure_runs WHERE (run_id IN (SELECT value FROM json_each(:keys))) ORDER BY run_id;

-- find runs.runs_opening_owners: lock touch
SELECT run_id, status, session_id, source, principal, scopes, payload_json, requested_priority, intent_digest, idempotency_key, queue_name, priority, workflow_name, workflow_revision, workflow_digest, enqueue_seq, started_at, node, owner_kind, owner_id, error, created_at, updated_at, admitted_node, result_json, max_hop_retries, hop_retries, retry_of, wake_at, deadline FROM tenure_runs WHERE (run_id IN (SELECT value FROM json_each(:keys))) ORDER BY run_id;

-- find runs.session_open: lock none
SELECT run_id, status, session_id, source, principal, scopes, payload_json, requested_priority, intent_digest, idempotency_key, queue_name, priority, workflow_name, workflow_revision, workflow_digest, enqueue_seq, started_at, node, owner_kind, owner_id, error, created_at, updated_at, admitted_node, result_json, max_hop_retries, hop_retries, retry_of, wake_at, deadline FROM tenure_runs WHERE (session_id = :session_id AND status IN ('awaiting_consent', 'awaiting_delegate', 'awaiting_hardware', 'awaiting_message', 'awaiting_service', 'awaiting_timer', 'cancelling', 'queued', 'running')) ORDER BY run_id;

-- find runs.runs_by_admission_key: lock none
SELECT run_id, status, session_id, source, principal, scopes, payload_json, requested_priority, intent_digest, idempotency_key, queue_name, priority, workflow_name, workflow_revision, workflow_digest, enqueue_seq, started_at, node, owner_kind, owner_id, error, created_at, updated_at, admitted_node, result_json, max_hop_retries, hop_retries, retry_of, wake_at, deadline FROM tenure_runs WHERE (idempotency_key = :key) ORDER BY created_at, run_id;


-- ==== run_deliveries (table tenure_run_deliveries) ====

-- insert: a new row, returned as stored
INSERT INTO tenure_run_deliveries (delivery_id, run_id, enqueue_seq, state, queue_name, priority, resume, publish_attempts, last_error, claimed_by, published_at, claimed_at, settled_at, created_at) VALUES (:delivery_id, :run_id, :enqueue_seq, :state, :queue_name, :priority, :resume, :publish_attempts, :last_error, :claimed_by, :published_at, :claimed_at, :settled_at, :created_at) RETURNING delivery_id, run_id, enqueue_seq, state, queue_name, priority, resume, publish_attempts, last_error, claimed_by, published_at, claimed_at, settled_at, created_at;

-- update: compare-and-set of one row (every mutable column as decided on), returned as written
UPDATE tenure_run_deliveries SET state = :state, publish_attempts = :publish_attempts, last_error = :last_error, claimed_by = :claimed_by, published_at = :published_at, claimed_at = :claimed_at, settled_at = :settled_at WHERE delivery_id = :old_key AND state IS :old_state AND publish_attempts IS :old_publish_attempts AND last_error IS :old_last_error AND claimed_by IS :old_claimed_by AND published_at IS :old_published_at AND claimed_at IS :old_claimed_at AND settled_at IS :old_settled_at RETURNING delivery_id, run_id, enqueue_seq, state, queue_name, priority, resume, publish_attempts, last_error, claimed_by, published_at, claimed_at, settled_at, created_at;

-- update_seen: compare-and-set of one row decided on as last seen, not read in this transaction (every column), returned as written
UPDATE tenure_run_deliveries SET state = :state, publish_attempts = :publish_attempts, last_error = :last_error, claimed_by = :claimed_by, published_at = :published_at, claimed_at = :claimed_at, settled_at = :settled_at WHERE delivery_id = :old_key AND run_id IS :old_run_id AND enqueue_seq IS :old_enqueue_seq AND state IS :old_state AND queue_name IS :old_queue_name AND priority IS :old_priority AND resume IS :old_resume AND publish_attempts IS :old_publish_attempts AND last_error IS :old_last_error AND claimed_by IS :old_claimed_by AND published_at IS :old_published_at AND claimed_at IS :old_claimed_at AND settled_at IS :old_settled_at AND created_at IS :old_created_at RETURNING delivery_id, run_id, enqueue_seq, state, queue_name, priority, resume, publish_attempts, last_error, claimed_by, published_at, claimed_at, settled_at, created_at;

-- delete: compare-and-set delete of one row
DELETE FROM tenure_run_deliveries WHERE delivery_id = :old_key AND state IS :old_state AND publish_attempts IS :old_publish_attempts AND last_error IS :old_last_error AND claimed_by IS :old_claimed_by AND published_at IS :old_published_at AND claimed_at IS :old_claimed_at AND settled_at IS :old_settled_at RETURNING delivery_id;

-- read_keys: the rows with these keys as they are (no lock, no clock)
SELECT delivery_id, run_id, enqueue_seq, state, queue_name, priority, resume, publish_attempts, last_error, claimed_by, published_at, claimed_at, settled_at, created_at FROM tenure_run_deliveries WHERE delivery_id IN (SELECT value FROM json_each(:keys)) ORDER BY delivery_id;

-- find runs.deliveries_by_keys: lock wait
SELECT delivery_id, run_id, enqueue_seq, state, queue_name, priority, resume, publish_attempts, last_error, claimed_by, published_at, claimed_at, settled_at, created_at FROM tenure_run_deliveries WHERE (delivery_id IN (SELECT value FROM json_each(:keys))) ORDER BY delivery_id;


-- ==== consents (table tenure_consents) ====

-- insert: a new row, returned as stored
INSERT INTO tenure_consents (consent_id, run_id, tool_name, tool_call_id, payload_json, status, decided_by, decided_at, preauthorized_by, created_at, expires_at) VALUES (:consent_id, :run_id, :tool_name, :tool_call_id, :payload_json, :status, :decided_by, :decided_at, :preauthorized_by, :created_at, :expires_at) RETURNING consent_id, run_id, tool_name, tool_call_id, payload_json, status, decided_by, decided_at, preauthorized_by, created_at, expires_at;

-- update: compare-and-set of one row (every mutable column as decided on), returned as written
UPDATE tenure_consents SET status = :status, decided_by = :decided_by, decided_at = :decided_at WHERE consent_id = :old_key AND status IS :old_status AND decided_by IS :old_decided_by AND decided_at IS :old_decided_at RETURNING consent_id, run_id, tool_name, tool_call_id, payload_json, status, decided_by, decided_at, preauthorized_by, created_at, expires_at;

-- update_seen: compare-and-set of one row decided on as last seen, not read in this transaction (every column), returned as written
UPDATE tenure_consents SET status = :status, decided_by = :decided_by, decided_at = :decided_at WHERE consent_id = :old_key AND run_id IS :old_run_id AND tool_name IS :old_tool_name AND tool_call_id IS :old_tool_call_id AND payload_json IS :old_payload_json AND status IS :old_status AND decided_by IS :old_decided_by AND decided_at IS :old_decided_at AND preauthorized_by IS :old_preauthorized_by AND created_at IS :old_created_at AND expires_at IS :old_expires_at RETURNING consent_id, run_id, tool_name, tool_call_id, payload_json, status, decided_by, decided_at, preauthorized_by, created_at, expires_at;

-- delete: compare-and-set delete of one row
DELETE FROM tenure_consents WHERE consent_id = :old_key AND status IS :old_status AND decided_by IS :old_decided_by AND decided_at IS :old_decided_at RETURNING consent_id;

-- read_keys: the rows with these keys as they are (no lock, no clock)
SELECT consent_id, run_id, tool_name, tool_call_id, payload_json, status, decided_by, decided_at, preauthorized_by, created_at, expires_at FROM tenure_consents WHERE consent_id IN (SELECT value FROM json_each(:keys)) ORDER BY consent_id;

-- find runs.pending_consents_of_run: lock wait
SELECT consent_id, run_id, tool_name, tool_call_id, payload_json, status, decided_by, decided_at, preauthorized_by, created_at, expires_at FROM tenure_consents WHERE (run_id = :run_id AND status = 'pending') ORDER BY consent_id;

-- find runs.consents_of_run: lock none
SELECT consent_id, run_id, tool_name, tool_call_id, payload_json, status, decided_by, decided_at, preauthorized_by, created_at, expires_at FROM tenure_consents WHERE (run_id = :run_id) ORDER BY consent_id;

-- find runs.consents_of_runs: lock none
SELECT consent_id, run_id, tool_name, tool_call_id, payload_json, status, decided_by, decided_at, preauthorized_by, created_at, expires_at FROM tenure_consents WHERE (run_id IN (SELECT value FROM json_each(:run_ids))) ORDER BY run_id, consent_id;

-- find consents.consents_by_keys: lock wait
SELECT consent_id, run_id, tool_name, tool_call_id, payload_json, status, decided_by, decided_at, preauthorized_by, created_at, expires_at FROM tenure_consents WHERE (consent_id IN (SELECT value FROM json_each(:keys))) ORDER BY consent_id;

-- find consents.due_consents: lock none
SELECT consent_id, run_id, tool_name, tool_call_id, payload_json, status, decided_by, decided_at, preauthorized_by, created_at, expires_at FROM tenure_consents WHERE (status = 'pending' AND expires_at <= :now) ORDER BY expires_at, consent_id;


-- ==== agent_jobs (table tenure_agent_jobs) ====

-- insert: a new row, returned as stored
INSERT INTO tenure_agent_jobs (job_id, request_id, run_id, runtime, profile, request_json, status, result_json, runtime_job_id, created_at, updated_at) VALUES (:job_id, :request_id, :run_id, :runtime, :profile, :request_json, :status, :result_json, :runtime_job_id, :created_at, :updated_at) RETURNING job_id, request_id, run_id, runtime, profile, request_json, status, result_json, runtime_job_id, created_at, updated_at;

-- update: compare-and-set of one row (every mutable column as decided on), returned as written
UPDATE tenure_agent_jobs SET status = :status, result_json = :result_json, runtime_job_id = :runtime_job_id, updated_at = :updated_at WHERE job_id = :old_key AND status IS :old_status AND result_json IS :old_result_json AND runtime_job_id IS :old_runtime_job_id AND updated_at IS :old_updated_at RETURNING job_id, request_id, run_id, runtime, profile, request_json, status, result_json, runtime_job_id, created_at, updated_at;

-- update_seen: compare-and-set of one row decided on as last seen, not read in this transaction (every column), returned as written
UPDATE tenure_agent_jobs SET status = :status, result_json = :result_json, runtime_job_id = :runtime_job_id, updated_at = :updated_at WHERE job_id = :old_key AND request_id IS :old_request_id AND run_id IS :old_run_id AND runtime IS :old_runtime AND profile IS :old_profile AND request_json IS :old_request_json AND status IS :old_status AND result_json IS :old_result_json AND runtime_job_id IS :old_runtime_job_id AND created_at IS :old_created_at AND updated_at IS :old_updated_at RETURNING job_id, request_id, run_id, runtime, profile, request_json, status, result_json, runtime_job_id, created_at, updated_at;

-- delete: compare-and-set delete of one row
DELETE FROM tenure_agent_jobs WHERE job_id = :old_key AND status IS :old_status AND result_json IS :old_result_json AND runtime_job_id IS :old_runtime_job_id AND updated_at IS :old_updated_at RETURNING job_id;

-- read_keys: the rows with these keys as they are (no lock, no clock)
SELECT job_id, request_id, run_id, runtime, profile, request_json, status, result_json, runtime_job_id, created_at, updated_at FROM tenure_agent_jobs WHERE job_id IN (SELECT value FROM json_each(:keys)) ORDER BY job_id;

-- find runs.open_jobs_of_run: lock none
SELECT job_id, request_id, run_id, runtime, profile, request_json, status, result_json, runtime_job_id, created_at, updated_at FROM tenure_agent_jobs WHERE (run_id = :run_id AND status IN ('admitted', 'lost', 'preparing', 'queued', 'running')) ORDER BY job_id;

-- find runs.jobs_of_run: lock none
SELECT job_id, request_id, run_id, runtime, profile, request_json, status, result_json, runtime_job_id, created_at, updated_at FROM tenure_agent_jobs WHERE (run_id = :run_id) ORDER BY job_id;

-- find runs.jobs_of_runs: lock none
SELECT job_id, request_id, run_id, runtime, profile, request_json, status, result_json, runtime_job_id, created_at, updated_at FROM tenure_agent_jobs WHERE (run_id IN (SELECT value FROM json_each(:run_ids))) ORDER BY run_id, job_id;

-- find runs.open_jobs_of_runs: lock none
SELECT job_id, request_id, run_id, runtime, profile, request_json, status, result_json, runtime_job_id, created_at, updated_at FROM tenure_agent_jobs WHERE (run_id IN (SELECT value FROM json_each(:run_ids)) AND status IN ('admitted', 'lost', 'preparing', 'queued', 'running')) ORDER BY run_id, job_id;

-- find agent_jobs.jobs_by_keys: lock wait
SELECT job_id, request_id, run_id, runtime, profile, request_json, status, result_json, runtime_job_id, created_at, updated_at FROM tenure_agent_jobs WHERE (job_id IN (SELECT value FROM json_each(:keys))) ORDER BY job_id;


-- ==== run_nodes (table tenure_run_nodes) ====

-- insert: a new row, returned as stored
INSERT INTO tenure_run_nodes (node, status, epoch, booted_at, lease_expires_at, taker, takeover_until, updated_at) VALUES (:node, :status, :epoch, :booted_at, :lease_expires_at, :taker, :takeover_until, :updated_at) RETURNING node, status, epoch, booted_at, lease_expires_at, taker, takeover_until, updated_at;

-- update: compare-and-set of one row (every mutable column as decided on), returned as written
UPDATE tenure_run_nodes SET status = :status, epoch = :epoch, booted_at = :booted_at, lease_expires_at = :lease_expires_at, taker = :taker, takeover_until = :takeover_until, updated_at = :updated_at WHERE node = :old_key AND status IS :old_status AND epoch IS :old_epoch AND booted_at IS :old_booted_at AND lease_expires_at IS :old_lease_expires_at AND taker IS :old_taker AND takeover_until IS :old_takeover_until AND updated_at IS :old_updated_at RETURNING node, status, epoch, booted_at, lease_expires_at, taker, takeover_until, updated_at;

-- update_seen: compare-and-set of one row decided on as last seen, not read in this transaction (every column), returned as written
UPDATE tenure_run_nodes SET status = :status, epoch = :epoch, booted_at = :booted_at, lease_expires_at = :lease_expires_at, taker = :taker, takeover_until = :takeover_until, updated_at = :updated_at WHERE node = :old_key AND status IS :old_status AND epoch IS :old_epoch AND booted_at IS :old_booted_at AND lease_expires_at IS :old_lease_expires_at AND taker IS :old_taker AND takeover_until IS :old_takeover_until AND updated_at IS :old_updated_at RETURNING node, status, epoch, booted_at, lease_expires_at, taker, takeover_until, updated_at;

-- delete: compare-and-set delete of one row
DELETE FROM tenure_run_nodes WHERE node = :old_key AND status IS :old_status AND epoch IS :old_epoch AND booted_at IS :old_booted_at AND lease_expires_at IS :old_lease_expires_at AND taker IS :old_taker AND takeover_until IS :old_takeover_until AND updated_at IS :old_updated_at RETURNING node;

-- read_keys: the rows with these keys as they are (no lock, no clock)
SELECT node, status, epoch, booted_at, lease_expires_at, taker, takeover_until, updated_at FROM tenure_run_nodes WHERE node IN (SELECT value FROM json_each(:keys)) ORDER BY node;

-- find nodes.nodes_by_keys: lock wait
SELECT node, status, epoch, booted_at, lease_expires_at, taker, takeover_until, updated_at FROM tenure_run_nodes WHERE (node IN (SELECT value FROM json_each(:keys))) ORDER BY node;

-- find nodes.expired_nodes: lock none
SELECT node, status, epoch, booted_at, lease_expires_at, taker, takeover_until, updated_at FROM tenure_run_nodes WHERE (status = 'live' AND lease_expires_at <= :now) OR (status = 'taking_over' AND takeover_until <= :now) ORDER BY lease_expires_at, node;


-- ==== run_messages (table tenure_run_messages) ====

-- insert: a new row, returned as stored
INSERT INTO tenure_run_messages (slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by) VALUES (:slot_id, :run_id, :topic, :status, :message_id, :message_json, :sequence, :sent_at, :receive_key, :expires_at, :created_at, :decided_at, :decided_by) RETURNING slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by;

-- update: compare-and-set of one row (every mutable column as decided on), returned as written
UPDATE tenure_run_messages SET status = :status, message_id = :message_id, message_json = :message_json, sequence = :sequence, sent_at = :sent_at, receive_key = :receive_key, expires_at = :expires_at, decided_at = :decided_at, decided_by = :decided_by WHERE slot_id = :old_key AND status IS :old_status AND message_id IS :old_message_id AND message_json IS :old_message_json AND sequence IS :old_sequence AND sent_at IS :old_sent_at AND receive_key IS :old_receive_key AND expires_at IS :old_expires_at AND decided_at IS :old_decided_at AND decided_by IS :old_decided_by RETURNING slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by;

-- update_seen: compare-and-set of one row decided on as last seen, not read in this transaction (every column), returned as written
UPDATE tenure_run_messages SET status = :status, message_id = :message_id, message_json = :message_json, sequence = :sequence, sent_at = :sent_at, receive_key = :receive_key, expires_at = :expires_at, decided_at = :decided_at, decided_by = :decided_by WHERE slot_id = :old_key AND run_id IS :old_run_id AND topic IS :old_topic AND status IS :old_status AND message_id IS :old_message_id AND message_json IS :old_message_json AND sequence IS :old_sequence AND sent_at IS :old_sent_at AND receive_key IS :old_receive_key AND expires_at IS :old_expires_at AND created_at IS :old_created_at AND decided_at IS :old_decided_at AND decided_by IS :old_decided_by RETURNING slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by;

-- delete: compare-and-set delete of one row
DELETE FROM tenure_run_messages WHERE slot_id = :old_key AND status IS :old_status AND message_id IS :old_message_id AND message_json IS :old_message_json AND sequence IS :old_sequence AND sent_at IS :old_sent_at AND receive_key IS :old_receive_key AND expires_at IS :old_expires_at AND decided_at IS :old_decided_at AND decided_by IS :old_decided_by RETURNING slot_id;

-- read_keys: the rows with these keys as they are (no lock, no clock)
SELECT slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by FROM tenure_run_messages WHERE slot_id IN (SELECT value FROM json_each(:keys)) ORDER BY slot_id;

-- find runs.pending_receives_of_run: lock wait
SELECT slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by FROM tenure_run_messages WHERE (run_id = :run_id AND status = 'pending') ORDER BY slot_id;

-- find runs.receives_of_run: lock none
SELECT slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by FROM tenure_run_messages WHERE (run_id = :run_id AND receive_key IS NOT NULL) ORDER BY slot_id;

-- find runs.receives_of_runs: lock none
SELECT slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by FROM tenure_run_messages WHERE (run_id IN (SELECT value FROM json_each(:run_ids)) AND receive_key IS NOT NULL) ORDER BY run_id, slot_id;

-- find messages.messages_by_keys: lock wait
SELECT slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by FROM tenure_run_messages WHERE (slot_id IN (SELECT value FROM json_each(:keys))) ORDER BY slot_id;

-- find messages.message_of_run: lock wait
SELECT slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by FROM tenure_run_messages WHERE (run_id = :run_id AND message_id = :message_id) ORDER BY slot_id;

-- find messages.receive_of_run: lock wait
SELECT slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by FROM tenure_run_messages WHERE (run_id = :run_id AND receive_key = :receive_key) ORDER BY slot_id;

-- find messages.pending_of_topic: lock wait
SELECT slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by FROM tenure_run_messages WHERE (run_id = :run_id AND topic = :topic AND status = 'pending') ORDER BY created_at, slot_id;

-- find messages.first_sent_of_topic: lock none
SELECT slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by FROM tenure_run_messages WHERE (run_id = :run_id AND topic = :topic AND status = 'sent') ORDER BY sequence;

-- find messages.last_of_topic: lock none
SELECT slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by FROM tenure_run_messages WHERE (run_id = :run_id AND topic = :topic AND sequence IS NOT NULL) ORDER BY sequence DESC;

-- find messages.due_receives: lock none
SELECT slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by FROM tenure_run_messages WHERE (status = 'pending' AND expires_at <= :now) ORDER BY expires_at, slot_id;

-- find messages.slots_of_run: lock none
SELECT slot_id, run_id, topic, status, message_id, message_json, sequence, sent_at, receive_key, expires_at, created_at, decided_at, decided_by FROM tenure_run_messages WHERE (run_id = :run_id) ORDER BY created_at, slot_id;

//! The SQL: the row states as stored, and every statement's text, one
//! table per schema, in [`Q`]'s order (each connection prepares them
//! once, on first use).

use crate::wait;

// Row states, as stored (`smallint`).
pub(crate) const INSERTED: i16 = 0;
pub(crate) const IN_PROGRESS: i16 = 1;
pub(crate) const RETRYABLE: i16 = 2;
pub(crate) const COMPLETED: i16 = 3;
pub(crate) const FAILED: i16 = 4;
pub(crate) const FORGOTTEN: i16 = 5;
pub(crate) const DEAD_LETTERED: i16 = 6;

/// The statements, by index into [`Sql`] and each connection's cache.
#[derive(Clone, Copy)]
pub(crate) enum Q {
    Insert,
    Begin1,
    Lock,
    Peek,
    Take,
    Finish,
    CompleteBatch,
    Release,
    Renew,
    Evict,
    Forget,
    Requeue,
    Resolve,
    Answer,
    PendingIntents,
    Doubted,
    Advance,
    DeadLetters,
    Waiting,
    SeqLock,
    SeqFind,
    Events,
    EventsPut,
    EventsDel,
    SeqSet,
    EvictEntities,
    SweepParked,
    Tallies,
    EvictCompletions,
    Completions,
}
pub(crate) const STATEMENTS: usize = 30;

/// An entity's `next` when it has no sequencer state: `stored(0)` of
/// `crate::order` (`i64::MIN`, written so that it parses).
pub(crate) const NO_NEXT: &str = "(-9223372036854775807::int8 - 1)";

/// The statements' text for one schema.
pub(crate) struct Sql(pub(crate) [String; STATEMENTS]);

/// The deciding statement's time: the given clock's reading (`$1`) or the
/// database's.
const NOW: &str = "coalesce($1::int8, (extract(epoch from clock_timestamp()) * 1000)::int8)";
/// What `begin` returns of the row it claimed, after the token, first
/// token and provider key (columns 3 to 7): the operation's first attempt
/// time, the lease's end and the round (attempts before it, its start —
/// 0: the operation's first attempt —, its interruptions; schema version
/// 6).
const CLAIMED: &str = "first_at, lease_until, round_before, round_since, round_interrupted";
const COLUMNS: &str = "state, fingerprint, attempt, token, first_token, first_at, lease_until, lease_ms, abandoned, any_fp, outcome";
/// The dead-letter columns (schema version 2), read after [`COLUMNS`] and
/// the time (columns 12 to 14): when the key was dead-lettered, its
/// round's first failure (0: none yet), the payload of
/// `Failure::Exhausted` (its reason is the row's outcome).
///
/// Then (column 15) when the row expires (0: never; a dead letter), by
/// the store's time: a row past it is absent to every call and deleted by
/// [`PgStore::evict_expired`](crate::PgStore::evict_expired).
const DEAD_COLUMNS: &str = "failed_at, first_failed_at, payload, expires_at";

/// The operation's provider key (schema version 3), 32 hex digits: MD5
/// over the row's own fields (the key, length-framed, the fencing token
/// of the operation's first attempt, which the database's sequence
/// handed out, and the request fingerprint), so every instance derives
/// the same one, every attempt of one operation gets it, and a corrected
/// request (`Failure::RetryableAnyRequest`) gets a new one, as on the
/// engine. Computed by the database: no instance's hasher is involved.
pub(crate) fn provider_key(k: &str) -> String {
    format!(
        "md5(int4send(length({k}scope)) || {k}scope || {k}id || int8send({k}first_token) || {k}fingerprint)"
    )
}

/// The intent columns (schema version 3), read after [`DEAD_COLUMNS`]
/// (columns 17 to 24, the provider key in 16): the intent's target (NULL:
/// none recorded), whether it is settled (answered, or a duplicate
/// candidate whose operation finished; otherwise pending), the provider's answer to the latest call
/// (`Answered`'s numbers: 0 none, 1 accepted, 2 refused, 3 unknown, 4
/// asked and not found), whether an earlier call's fate is open, the
/// doubt (`Doubt`'s numbers: 0 none, 1 after unknown, 2 two references),
/// the request, reference or reason (as the engine's intent record's
/// data), when the intent was first recorded, the
/// attempt that last wrote it. (`intent_ref`, the MD5 of the first
/// reference, is written only by statements.)
pub(crate) const INTENT_COLUMNS: &str = "intent_target, intent_settled, intent_answer, intent_open, \
    intent_doubt, intent_data, intent_at, intent_attempt";

/// The intent columns of a row with no intent (a new operation's).
const INTENT_RESET: &str = "intent_target = NULL, intent_settled = false, intent_answer = 0, \
    intent_open = false, intent_ref = NULL, intent_doubt = 0, intent_data = ''::bytea, intent_at = 0, \
    intent_attempt = 0";

/// A listing's tie-breaker between entries of one time: the MD5 of the
/// key (length-framed), 16 bytes, in a [`Cursor`](dedupkv::Cursor) as its
/// `id`.
const KEY_ORDER: &str = "decode(md5(int4send(length(scope)) || scope || id), 'hex')";

/// The position columns of a listing ordered by `time` (read after the
/// key: `list_at`, `list_kh`).
fn page_columns(time: &str) -> String {
    format!("{time} AS list_at, {KEY_ORDER} AS list_kh")
}

/// The rest of a listing ordered by `time`: $1 now, $2 scope (NULL:
/// every scope), $3 limit, $4 minimum age in ms (NULL: any), $5 and $6
/// the cursor's time and key order (NULL: from the start).
fn paged(time: &str) -> String {
    format!(
        "AND ($2::bytea IS NULL OR scope = $2::bytea) \
         AND ($4::int8 IS NULL OR {time} <= {NOW} - $4::int8) \
         AND ($5::int8 IS NULL OR ({time}, {KEY_ORDER}) > ($5::int8, $6::bytea)) \
         ORDER BY {time}, {KEY_ORDER} LIMIT $3::int8"
    )
}

/// Whether the row `k` (an alias, `"k."` or `""`) expired at `now`.
fn expired(k: &str, now: &str) -> String {
    format!("({k}expires_at > 0 AND {k}expires_at <= {now} AND {k}state <> {DEAD_LETTERED})")
}

/// [`NOW`] with the clock's reading in parameter `$n`.
fn now_at(n: u8) -> String {
    NOW.replace("$1", &format!("${n}"))
}

impl Sql {
    // One table of statements, in `Q`'s order: split, the order would be
    // kept in two places.
    #[allow(clippy::too_many_lines)]
    pub(crate) fn new(schema: &str) -> Sql {
        let k = format!("{schema}.dedupkv_keys");
        let v = format!("{schema}.dedupkv_versions");
        let ev = format!("{schema}.dedupkv_events");
        let seq = format!("{schema}.dedupkv_token");
        let (now3, now4, now5, now7) = (now_at(3), now_at(4), now_at(5), now_at(7));
        let gone = expired("k.", "excluded.first_at");
        // Column 25: when the row's latest record was written (0: by a
        // build before schema version 3).
        let read = format!(
            "{COLUMNS}, {NOW}, {DEAD_COLUMNS}, {}, {INTENT_COLUMNS}, updated_at",
            provider_key("")
        );
        let pk = provider_key("");
        let close_all = close_intent("", "true", "false");
        let close_k = close_intent("k.", "true", "false");
        let close_finished = close_intent(
            "",
            &format!("$4::int2 IN ({COMPLETED}, {FAILED})"),
            &format!("$4::int2 = {DEAD_LETTERED}"),
        );
        Sql([
            // Q::Insert: $1 now, $2 scopes, $3 ids, $4 retention ms. A
            // forgotten or expired row is absent: it is taken.
            format!(
                "INSERT INTO {k} AS k ({COLUMNS}, scope, id, expires_at, retention_ms, updated_at) \
                 SELECT {INSERTED}::int2, ''::bytea, 0, 0::int8, 0::int8, n.now, 0::int8, 0::int8, false, false, ''::bytea, u.s, u.i, \
                 n.now + $4::int8, $4::int8, n.now \
                 FROM (SELECT {NOW} AS now) n, unnest($2::bytea[], $3::bytea[]) AS u(s, i) \
                 ON CONFLICT (scope, id) DO UPDATE SET state = {INSERTED}, fingerprint = ''::bytea, attempt = 0, \
                 token = 0, first_token = 0, first_at = excluded.first_at, lease_until = 0, lease_ms = 0, \
                 abandoned = false, any_fp = false, outcome = ''::bytea, failed_at = 0, first_failed_at = 0, payload = NULL, \
                 expires_at = excluded.expires_at, retention_ms = excluded.retention_ms, updated_at = excluded.updated_at, \
                 {INTENT_RESET} \
                 WHERE k.state = {FORGOTTEN} OR {gone} RETURNING k.scope, k.id"
            ),
            // Q::Begin1: $1 now, $2 scope, $3 id, $4 fingerprint, $5 lease
            // ms, $6 retention ms (a claim is kept to its lease end at
            // least), $7 the intent's target (NULL: none), $8 its request:
            // the intent is written by the claim's own statement.
            format!(
                "INSERT INTO {k} ({COLUMNS}, scope, id, expires_at, retention_ms, intent_target, intent_data, \
                 intent_at, intent_attempt, updated_at) \
                 SELECT {IN_PROGRESS}::int2, $4::bytea, 1, t.v, t.v, n.now, n.now + $5::int8, $5::int8, false, false, ''::bytea, $2::bytea, $3::bytea, \
                 n.now + greatest($5::int8, $6::int8), $6::int8, $7::text, coalesce($8::bytea, ''::bytea), \
                 CASE WHEN $7::text IS NULL THEN 0 ELSE n.now END, CASE WHEN $7::text IS NULL THEN 0 ELSE 1 END, n.now \
                 FROM (SELECT {NOW} AS now) n, (SELECT nextval('{seq}') AS v) t \
                 ON CONFLICT (scope, id) DO NOTHING RETURNING token, first_token, {pk}, {CLAIMED}"
            ),
            // Q::Lock: $1 now, $2 scope, $3 id.
            format!("SELECT {read} FROM {k} WHERE scope = $2::bytea AND id = $3::bytea FOR UPDATE"),
            // Q::Peek: Q::Lock without the lock (an answer that writes nothing).
            format!("SELECT {read} FROM {k} WHERE scope = $2::bytea AND id = $3::bytea"),
            // Q::Take: $1 scope, $2 id, $3 fingerprint, $4 attempt, $5
            // first_at, $6 lease_until, $7 lease ms, $8 a new operation,
            // $9 the previous attempt was stranded (its lease lapsed), $10 now,
            // $11 retention ms, $12 the intent's target (NULL: none), $13
            // its request, $14 the previous attempt never answered (one
            // more interruption in the round; a new operation starts a
            // round). With an intent, the previous call's fate is open
            // unless it was answered (a new operation starts afresh); without
            // one, a new operation has none and another attempt keeps the
            // operation's (as the engine's `Calls::next_attempt`).
            format!(
                "UPDATE {k} SET state = {IN_PROGRESS}, fingerprint = $3::bytea, attempt = $4::int4, token = t.v, \
                 first_token = CASE WHEN $8::bool THEN t.v ELSE first_token END, first_at = $5::int8, \
                 lease_until = $6::int8, lease_ms = $7::int8, abandoned = false, any_fp = false, outcome = ''::bytea, \
                 first_failed_at = CASE WHEN $8::bool THEN 0 \
                     WHEN $9::bool THEN coalesce(nullif(first_failed_at, 0), $10::int8) ELSE first_failed_at END, \
                 payload = NULL, expires_at = greatest($10::int8 + $11::int8, $6::int8), retention_ms = $11::int8, \
                 updated_at = $10::int8, \
                 intent_open = CASE WHEN $12::text IS NOT NULL THEN intent_target IS NOT NULL AND NOT $8::bool \
                     AND (intent_open OR intent_answer IN (0, 3, 4)) \
                     WHEN $8::bool THEN false ELSE intent_open END, \
                 intent_at = CASE WHEN $12::text IS NOT NULL AND (intent_target IS NULL OR intent_settled OR $8::bool) \
                     THEN $10::int8 \
                     WHEN $8::bool THEN 0 ELSE intent_at END, \
                 intent_target = CASE WHEN $12::text IS NOT NULL THEN $12::text WHEN $8::bool THEN NULL ELSE intent_target END, \
                 intent_settled = CASE WHEN $12::text IS NOT NULL OR $8::bool THEN false ELSE intent_settled END, \
                 intent_answer = CASE WHEN $12::text IS NOT NULL OR $8::bool THEN 0 ELSE intent_answer END, \
                 intent_data = CASE WHEN $12::text IS NOT NULL THEN $13::bytea WHEN $8::bool THEN ''::bytea \
                     ELSE intent_data END, \
                 intent_ref = CASE WHEN $8::bool THEN NULL ELSE intent_ref END, \
                 intent_doubt = CASE WHEN $8::bool THEN 0 ELSE intent_doubt END, \
                 intent_attempt = CASE WHEN $12::text IS NOT NULL THEN $4::int4 WHEN $8::bool THEN 0 ELSE intent_attempt END, \
                 round_before = CASE WHEN $8::bool THEN 0 ELSE round_before END, \
                 round_since = CASE WHEN $8::bool THEN 0 ELSE round_since END, \
                 round_interrupted = CASE WHEN $8::bool THEN 0 \
                     WHEN $14::bool THEN round_interrupted + 1 ELSE round_interrupted END \
                 FROM (SELECT nextval('{seq}') AS v) t \
                 WHERE scope = $1::bytea AND id = $2::bytea RETURNING token, first_token, {pk}, {CLAIMED}"
            ),
            // Q::Finish: $1 scope, $2 id, $3 token, $4 state, $5 outcome (a
            // dead letter's reason), $6 any fingerprint next, $7 now, $8 a
            // dead letter's payload, $9 a completion's amount (counted in
            // its window), $10 the outcome's retention ms (NULL: the
            // operation's).
            notifying_counted(
                schema,
                &format!(
                    "UPDATE {k} SET state = $4::int2, outcome = $5::bytea, abandoned = false, any_fp = $6::bool, \
                     failed_at = CASE WHEN $4::int2 = {DEAD_LETTERED} THEN {now7} ELSE failed_at END, \
                     first_failed_at = CASE WHEN $4::int2 IN ({RETRYABLE}, {DEAD_LETTERED}) \
                         THEN coalesce(nullif(first_failed_at, 0), {now7}) ELSE first_failed_at END, \
                     payload = $8::bytea, updated_at = {now7}, \
                     {close_finished}, \
                     retention_ms = coalesce($10::int8, retention_ms), \
                     expires_at = CASE WHEN $4::int2 = {DEAD_LETTERED} THEN 0 \
                         ELSE {now7} + coalesce($10::int8, retention_ms) END \
                     WHERE scope = $1::bytea AND id = $2::bytea AND token = $3::int8 AND state = {IN_PROGRESS}"
                ),
                "",
                false,
                Some("$9::int8"),
            ),
            // Q::CompleteBatch: $1 scopes, $2 ids, $3 tokens, $4 outcomes, $5
            // now. Each completion closes its pending intent and is counted
            // (amount 0).
            notifying_counted(
                schema,
                &format!(
                    "UPDATE {k} AS k SET state = {COMPLETED}, outcome = u.o, abandoned = false, any_fp = false, \
                     expires_at = {now5} + k.retention_ms, updated_at = {now5}, {close_k} \
                     FROM unnest($1::bytea[], $2::bytea[], $3::int8[], $4::bytea[]) AS u(s, i, t, o) \
                     WHERE k.scope = u.s AND k.id = u.i AND k.token = u.t AND k.state = {IN_PROGRESS}"
                ),
                "k.",
                true,
                Some("0"),
            ),
            // Q::Release: $1 scope, $2 id, $3 token, $4 now.
            notifying(
                schema,
                &format!(
                    "UPDATE {k} SET state = {RETRYABLE}, abandoned = true, \
                     first_failed_at = coalesce(nullif(first_failed_at, 0), {now4}), \
                     expires_at = {now4} + retention_ms, updated_at = {now4} \
                     WHERE scope = $1::bytea AND id = $2::bytea AND token = $3::int8 AND state = {IN_PROGRESS}"
                ),
                "",
                false,
            ),
            // Q::Renew: $1 now, $2 scope, $3 id, $4 token, $5 lease ms or null.
            format!(
                "UPDATE {k} SET lease_ms = coalesce($5::int8, lease_ms), \
                 lease_until = {NOW} + coalesce($5::int8, lease_ms), \
                 expires_at = greatest(expires_at, {NOW} + coalesce($5::int8, lease_ms)), updated_at = {NOW} \
                 WHERE scope = $2::bytea AND id = $3::bytea AND token = $4::int8 AND state = {IN_PROGRESS} \
                 RETURNING lease_until"
            ),
            // Q::Evict: $1 now, $2 batch size. Expired rows (never a dead
            // letter), a batch at a time; a row another call holds locked
            // is skipped (it is being decided) and met by a later pass.
            format!(
                "DELETE FROM {k} WHERE (scope, id) IN (SELECT scope, id FROM {k} WHERE {e} \
                 LIMIT $2::int8 FOR UPDATE SKIP LOCKED) AND {e}",
                e = expired("", NOW),
            ),
            // Q::Forget: $1 scope, $2 id, $3 now (under the lock of Q::Lock):
            // the forgotten record is kept for the operation's retention.
            format!(
                "UPDATE {k} SET state = {FORGOTTEN}, abandoned = false, expires_at = $3::int8 + retention_ms, updated_at = $3::int8, \
                 {INTENT_RESET} \
                 WHERE scope = $1::bytea AND id = $2::bytea"
            ),
            // Q::Requeue: $1 scope, $2 id, $3 now. The next attempt is
            // numbered after the last; a new round of failures starts.
            format!(
                "UPDATE {k} SET state = {RETRYABLE}, abandoned = false, any_fp = false, outcome = ''::bytea, \
                 first_failed_at = 0, payload = NULL, expires_at = {now3} + retention_ms, updated_at = {now3}, \
                 round_before = attempt, round_since = {now3}, round_interrupted = 0 \
                 WHERE scope = $1::bytea AND id = $2::bytea AND state = {DEAD_LETTERED}"
            ),
            // Q::Resolve: $1 scope, $2 id, $3 state (completed or failed), $4
            // outcome or note, $5 now. A resolution as completed is counted
            // (amount 0), as the engine counts it.
            format!(
                "WITH done AS (UPDATE {k} SET state = $3::int2, outcome = $4::bytea, payload = NULL, \
                 expires_at = {now5} + retention_ms, updated_at = {now5}, {close_all} \
                 WHERE scope = $1::bytea AND id = $2::bytea AND state = {DEAD_LETTERED} \
                 RETURNING scope AS s, id AS i, state AS st, updated_at AS at, {pk} AS pk), {counted} \
                 SELECT 1 FROM done",
                counted = counting(schema, "0"),
            ),
            // Q::Answer: $1 scope, $2 id, $3 token, $4 the answer (1
            // accepted, 2 refused, 3 unknown, 4 not found, 5 found), $5 its
            // reference or reason, $6 the attempt. The engine's
            // `Calls::answered`, in one conditional statement by the
            // claim's fencing token: `ub`, the latest call's fate is
            // unknown or an earlier one's is; a reference is told from the
            // first by its MD5.
            format!(
                "UPDATE {k} SET \
                 intent_answer = {answer}, \
                 intent_open = {open}, \
                 intent_doubt = greatest(intent_doubt, CASE \
                     WHEN $4::int2 IN (1, 5) AND intent_ref IS NOT NULL AND intent_ref <> {h} THEN 2 \
                     WHEN $4::int2 = 1 AND intent_ref IS NULL AND {ub} THEN 1 \
                     WHEN $4::int2 = 3 AND {ub} THEN 1 ELSE 0 END), \
                 intent_ref = CASE WHEN $4::int2 IN (1, 5) THEN coalesce(intent_ref, {h}) ELSE intent_ref END, \
                 intent_data = CASE WHEN $4::int2 IN (1, 2, 5) THEN $5::bytea \
                     WHEN (intent_answer IN (0, 3, 4)) = ({answer} IN (0, 3, 4)) THEN intent_data ELSE ''::bytea END, \
                 intent_settled = NOT ({open} OR {answer} IN (0, 3, 4)), \
                 intent_attempt = $6::int4 \
                 WHERE scope = $1::bytea AND id = $2::bytea AND token = $3::int8 AND state = {IN_PROGRESS} \
                 AND intent_target IS NOT NULL",
                ub = "(intent_open OR intent_answer = 3)",
                h = "decode(md5($5::bytea), 'hex')",
                answer = "(CASE WHEN $4::int2 IN (1, 5) THEN 1 WHEN $4::int2 IN (2, 3) THEN $4::int2 \
                    WHEN intent_answer IN (1, 2) THEN intent_answer ELSE 4 END)",
                open = "(CASE WHEN $4::int2 IN (2, 3) THEN (intent_open OR intent_answer = 3) ELSE false END)",
            ),
            // Q::PendingIntents: paged (`paged`). Pending intents (a call
            // may or may not have happened; a finished operation's are
            // closed or settled), oldest first by when they were recorded.
            format!(
                "SELECT {read}, scope, id, {page} FROM {k} WHERE intent_target IS NOT NULL AND NOT intent_settled \
                 AND NOT {gone_now} {rest}",
                gone_now = expired("", NOW),
                page = page_columns("intent_at"),
                rest = paged("intent_at"),
            ),
            // Q::Doubted: as Q::PendingIntents, the operations with a doubt
            // (a candidate for a duplicate external effect), in any state.
            format!(
                "SELECT {read}, scope, id, {page} FROM {k} WHERE intent_target IS NOT NULL AND intent_doubt > 0 \
                 AND NOT {gone_now} {rest}",
                gone_now = expired("", NOW),
                page = page_columns("intent_at"),
                rest = paged("intent_at"),
            ),
            // Q::Advance: $1 scope, $2 id, $3 version (order-preserving
            // as int8, `crate::order`), $4 now, $5 the entity retention
            // in ms. One statement, atomic per entity: a new entity's row
            // is inserted (`previous` NULL); an existing one is updated
            // under its row lock, `previous` keeping the version it had and
            // `version` the greater; the answer is read from what comes
            // back. An expired entity (`gone`) starts afresh, as a new one.
            // Only an applied version extends the expiry; an entity with
            // stored events (`expires_at` 0) never expires.
            format!(
                "INSERT INTO {v} AS v (scope, id, version, previous, expires_at) \
                 SELECT $1::bytea, $2::bytea, $3::int8, NULL, n.now + $5::int8 FROM (SELECT {now4} AS now) n \
                 ON CONFLICT (scope, id) DO UPDATE SET \
                 previous = CASE WHEN {gone_v} THEN NULL ELSE v.version END, \
                 version = CASE WHEN {gone_v} THEN excluded.version ELSE greatest(v.version, excluded.version) END, \
                 next = CASE WHEN {gone_v} THEN {NO_NEXT} ELSE v.next END, \
                 gap_since = CASE WHEN {gone_v} THEN 0 ELSE v.gap_since END, \
                 expires_at = CASE WHEN v.expires_at = 0 THEN 0 \
                     WHEN {gone_v} OR v.version IS NULL OR excluded.version > v.version THEN excluded.expires_at \
                     ELSE v.expires_at END \
                 RETURNING previous",
                gone_v = "(v.expires_at > 0 AND v.expires_at <= excluded.expires_at - $5::int8)",
            ),
            // Q::DeadLetters: paged (`paged`). The dead-letter area, in the
            // order keys reached it (over the partial index
            // `dedupkv_keys_dead`).
            format!(
                "SELECT {read}, scope, id, {page} FROM {k} WHERE state = {DEAD_LETTERED} {rest}",
                page = page_columns("failed_at"),
                rest = paged("failed_at"),
            ),
            // Q::Waiting: $1 scope, $2 id. A waiter marks the attempt it
            // waits for, so the statement that ends it notifies (rows
            // nobody waited on end without a `NOTIFY`). The row lock
            // orders the mark and the finish: either the finish sees the
            // mark, or the mark finds the attempt ended and changes
            // nothing (the waiter's next `begin` sees the end).
            format!(
                "UPDATE {k} SET waited = true \
                 WHERE scope = $1::bytea AND id = $2::bytea AND state = {IN_PROGRESS} AND NOT waited"
            ),
            // Q::SeqLock: $1 now, $2 scope, $3 id. The entity's row, made
            // if absent and locked either way (the sequencer decides under
            // it, `crate::sequencer`): its next expected number, gap start
            // and the time. An expired entity (it has no stored events)
            // starts afresh; its expiry is written by Q::SeqSet.
            format!(
                "WITH n AS (SELECT {NOW} AS now) \
                 INSERT INTO {v} AS v (scope, id, version, previous, next, gap_since, expires_at) \
                 SELECT $2::bytea, $3::bytea, NULL, NULL, {NO_NEXT}, 0, n.now FROM n \
                 ON CONFLICT (scope, id) DO UPDATE SET \
                 version = CASE WHEN {gone} THEN NULL ELSE v.version END, \
                 previous = CASE WHEN {gone} THEN NULL ELSE v.previous END, \
                 next = CASE WHEN {gone} THEN {NO_NEXT} ELSE v.next END, \
                 gap_since = CASE WHEN {gone} THEN 0 ELSE v.gap_since END \
                 RETURNING next, gap_since, (SELECT now FROM n)",
                gone = "(v.expires_at > 0 AND v.expires_at <= excluded.expires_at)",
            ),
            // Q::SeqFind: $1 now, $2 scope, $3 id. As Q::SeqLock for a call
            // that makes no entity (`release_held`, `ack`).
            format!(
                "SELECT next, gap_since, {NOW} FROM {v} WHERE scope = $2::bytea AND id = $3::bytea FOR UPDATE"
            ),
            // Q::Events: $1 scope, $2 id. The entity's stored events (read
            // under its row lock).
            format!(
                "SELECT seq, state, payload, at, missing, since, handed_until FROM {ev} \
                 WHERE scope = $1::bytea AND id = $2::bytea ORDER BY seq"
            ),
            // Q::EventsPut: $1 scope, $2 id, then the events' arrays: $3
            // seq, $4 state, $5 payload, $6 at, $7 missing, $8 since, $9
            // handed_until. A stored event keeps its first payload.
            format!(
                "INSERT INTO {ev} (scope, id, seq, state, payload, at, missing, since, handed_until) \
                 SELECT $1::bytea, $2::bytea, u.* FROM unnest($3::int8[], $4::int2[], $5::bytea[], \
                 $6::int8[], $7::int8[], $8::int8[], $9::int8[]) AS u \
                 ON CONFLICT (scope, id, seq) DO UPDATE SET state = excluded.state, at = excluded.at, \
                 missing = excluded.missing, since = excluded.since, handed_until = excluded.handed_until"
            ),
            // Q::EventsDel: $1 scope, $2 id, $3 the acknowledged events' seq.
            format!(
                "DELETE FROM {ev} WHERE scope = $1::bytea AND id = $2::bytea AND seq = ANY($3::int8[])"
            ),
            // Q::SeqSet: $1 scope, $2 id, $3 next, $4 gap start, $5 expiry
            // (0: never, while it stores events).
            format!(
                "UPDATE {v} SET next = $3::int8, gap_since = $4::int8, expires_at = $5::int8 \
                 WHERE scope = $1::bytea AND id = $2::bytea"
            ),
            // Q::EvictEntities: $1 now, $2 batch size. As Q::Evict, for
            // expired entities (never one with stored events).
            format!(
                "DELETE FROM {v} WHERE (scope, id) IN (SELECT scope, id FROM {v} WHERE {e} \
                 LIMIT $2::int8 FOR UPDATE SKIP LOCKED) AND {e}",
                e = format!("(expires_at > 0 AND expires_at <= {NOW})"),
            ),
            // Q::SweepParked: $1 now, $2 max hold ms. The parked events of
            // every entity whose gap has been open longer than the hold
            // move to the holding area (missing: the number expected next,
            // `stored(1)` at least; since: the gap's start), under the
            // entities' row locks as a sequencer call takes them; an
            // entity another call holds is skipped (the next sweep, or its
            // own next `sequence`, moves them).
            format!(
                "WITH due AS (SELECT scope, id, next, gap_since FROM {v} \
                 WHERE gap_since > 0 AND gap_since < {NOW} - $2::int8 FOR UPDATE SKIP LOCKED) \
                 UPDATE {ev} AS e SET state = {HELD}, missing = greatest(due.next, {NO_NEXT} + 1), \
                 since = due.gap_since FROM due \
                 WHERE e.scope = due.scope AND e.id = due.id AND e.state = {PARKED}",
                HELD = crate::sequencer::HELD,
                PARKED = crate::sequencer::PARKED,
            ),
            // Q::Tallies: $1 now, $2 scope, $3 window ms, $4 retention ms.
            // The scope's windows kept (their end within the retention),
            // oldest first: start, count, the amounts' sum as text (an
            // i128).
            format!(
                "SELECT (at / $3::int8) * $3::int8 AS start, count(*), sum(amount)::text \
                 FROM {schema}.dedupkv_completions \
                 WHERE scope = $2::bytea AND (at / $3::int8) * $3::int8 + $3::int8 + $4::int8 > {NOW} \
                 GROUP BY 1 ORDER BY 1"
            ),
            // Q::EvictCompletions: $1 now, $2 batch size, $3 window ms, $4
            // retention ms. Counts of windows past their retention, a batch
            // at a time.
            format!(
                "DELETE FROM {schema}.dedupkv_completions WHERE ctid IN (SELECT ctid \
                 FROM {schema}.dedupkv_completions \
                 WHERE at < {NOW} - $4::int8 - $3::int8 LIMIT $2::int8)"
            ),
            // Q::Completions: $1 scope, $2 window ms, $3 first window
            // start, $4 last. The completions of those windows: window
            // start, id, provider key (hex), time.
            format!(
                "SELECT (at / $2::int8) * $2::int8, id, provider_key, at \
                 FROM {schema}.dedupkv_completions \
                 WHERE scope = $1::bytea AND at >= $3::int8 AND (at / $2::int8) * $2::int8 <= $4::int8 \
                 ORDER BY at"
            ),
        ])
    }
}

/// The `SET` of an intent's close by the statement that finishes its
/// operation (the engine's `close_intent`), for rows aliased `k` (`""` or
/// `"k."`): when `finished` holds, a pending intent is removed, unless it
/// is a duplicate candidate: then it is settled (kept, without its target
/// and data, for `duplicate_candidates`); a settled one stays. When
/// `given_up` holds (a dead letter), a pending intent whose last attempt
/// only asked (not found, nothing open) is settled: nothing happened.
fn close_intent(k: &str, finished: &str, given_up: &str) -> String {
    let pending = format!("({k}intent_target IS NOT NULL AND NOT {k}intent_settled)");
    let closing = format!("(({finished}) AND {pending})");
    let asked =
        format!("(({given_up}) AND {pending} AND {k}intent_answer = 4 AND NOT {k}intent_open)");
    format!(
        "intent_target = CASE WHEN {closing} AND {k}intent_doubt = 0 THEN NULL \
             WHEN {closing} OR {asked} THEN '' ELSE {k}intent_target END, \
         intent_data = CASE WHEN {closing} OR {asked} THEN ''::bytea ELSE {k}intent_data END, \
         intent_settled = CASE WHEN {closing} OR {asked} THEN true ELSE {k}intent_settled END"
    )
}

/// `update` (an `UPDATE` of rows of `dedupkv_keys`, whose columns are
/// qualified by `alias`: `""` or `"k."`) made to notify
/// [`wait::CHANNEL`] of each key it updated that a waiter marked
/// (`waited`, by [`Q::Waiting`]), in the same statement (the notification
/// goes out when it commits): a `SELECT` of the updated rows, their token
/// first if `token`, so its row count is the `UPDATE`'s. Only marked
/// rows notify because PostgreSQL commits notifying transactions one at a
/// time (each holds a database-wide lock through its commit's flush):
/// notifying at every finish made begin + complete with 16 workers run at
/// the rate of one fsync after another.
fn notifying(schema: &str, update: &str, alias: &str, token: bool) -> String {
    notifying_counted(schema, update, alias, token, None)
}

/// [`notifying`], and with `amount` (an SQL expression) each row the update
/// left completed is counted in `dedupkv_completions` by the same
/// statement, at its `updated_at`, with that amount.
fn notifying_counted(
    schema: &str,
    update: &str,
    alias: &str,
    token: bool,
    amount: Option<&str>,
) -> String {
    let (ret, first) = if token {
        (format!(", {alias}token AS t"), "done.t, ")
    } else {
        (String::new(), "")
    };
    let (ret, counted) = match amount {
        Some(amount) => (
            format!(
                "{ret}, {alias}state AS st, {alias}updated_at AS at, {} AS pk",
                provider_key(alias)
            ),
            format!(", {}", counting(schema, amount)),
        ),
        None => (ret, String::new()),
    };
    format!(
        "WITH done AS ({update} RETURNING {alias}scope AS s, {alias}id AS i, {alias}waited AS w{ret}){counted} \
         SELECT {first}CASE WHEN done.w THEN pg_notify('{chan}', {payload}) END FROM done",
        chan = wait::CHANNEL,
        payload = wait::payload_sql(schema, "done.s", "done.i"),
    )
}

/// The CTE that counts each completed row of `done` (columns `s`, `i`,
/// `st`, `at`, `pk`) in `dedupkv_completions` with `amount`.
fn counting(schema: &str, amount: &str) -> String {
    format!(
        "counted AS (INSERT INTO {schema}.dedupkv_completions (scope, id, at, amount, provider_key) \
         SELECT done.s, done.i, done.at, {amount}, done.pk FROM done WHERE done.st = {COMPLETED})"
    )
}

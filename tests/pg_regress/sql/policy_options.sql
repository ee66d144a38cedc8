-- Policy options: set by name in one JSON object, kept when left out, cleared by null; wrong ones are 22023.
BEGIN;
SELECT rate_limit.create_policy('partner', 600, '1 minute',
                                options => '{"description": "Partner API, owned by the integrations team"}');
SELECT rate_limit.alter_policy('partner', rate => 1200);
SELECT name, rate, description FROM rate_limit.policies WHERE name = 'partner';
-- built in PL/pgSQL or from a driver's text parameter
SELECT rate_limit.alter_policy('partner', options => jsonb_build_object('description', 'Partners: ' || 'tier 2'));
SELECT description FROM rate_limit.policies WHERE name = 'partner';
SELECT rate_limit.alter_policy('partner', options => '{"description": null}');
SELECT description IS NULL AS cleared FROM rate_limit.policies WHERE name = 'partner';
SAVEPOINT errors;
SELECT rate_limit.alter_policy('partner', options => '[1]');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO errors;
SELECT rate_limit.alter_policy('partner', options => '{"descripton": "x"}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK TO errors;
SELECT rate_limit.create_policy('other', 1, '1 second', options => '{"description": 7}');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- Hardening (#40): the trigger function of the extension's own tables is the owner's. Before, any role
-- could attach it to a table of its own, and each of its commits made every backend of the database
-- forget its cached policies. It also refuses, when it fires, any table but rate_limit.policies and
-- rate_limit.key_overrides (in the library).
REVOKE EXECUTE ON FUNCTION rate_limit.policies_changed() FROM PUBLIC;
COMMENT ON FUNCTION rate_limit.policies_changed() IS
    'Trigger: a change of rate_limit.policies or rate_limit.key_overrides is seen by every backend''s next transaction; a direct call is refused';

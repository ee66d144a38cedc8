-- Every function has a comment (the SQL surface's catalog test checks it): the policy cache's trigger too.
COMMENT ON FUNCTION rate_limit.policies_changed() IS
    'Trigger: every change of rate_limit.policies invalidates every backend''s policy cache; a direct call is refused';

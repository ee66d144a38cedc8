-- rate_limit.nodes_of(keys): under Citus, the node that holds each key (#31).
CREATE FUNCTION rate_limit."nodes_of"(
	"keys" TEXT[]
) RETURNS TABLE (
	"key" TEXT,
	"host" TEXT,
	"port" INT,
	"shard" bigint
)
STABLE SECURITY DEFINER PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'nodes_of_wrapper';
COMMENT ON FUNCTION rate_limit.nodes_of(text[]) IS
    'Under Citus, the node (host, port) and shard that hold each key, in the order given: where to send its calls';

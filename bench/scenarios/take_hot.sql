SELECT allowed FROM rate_limit.take('bench', 'hot');

SELECT rate_limiting_request('hot', 2, 60);

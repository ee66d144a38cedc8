-- Runs once when the regression database is created.
CREATE EXTENSION rate_limit;

-- Demo tables of the compose stack's source database, followed by the floe-cdc service
-- (jobs/postgres-cdc.toml). Text columns can be TOASTed, so the tables send full old rows.
CREATE TABLE customers (
  id bigint PRIMARY KEY,
  name text NOT NULL,
  email text,
  created_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE customers REPLICA IDENTITY FULL;

CREATE TABLE orders (
  id bigint PRIMARY KEY,
  customer_id bigint NOT NULL REFERENCES customers (id),
  amount numeric(12,2) NOT NULL,
  status text NOT NULL DEFAULT 'new',
  tags text[],
  created_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE orders REPLICA IDENTITY FULL;

INSERT INTO customers (id, name, email)
SELECT g, 'customer ' || g, 'c' || g || '@example.com' FROM generate_series(1, 100) g;
INSERT INTO orders (id, customer_id, amount, tags)
SELECT g, 1 + g % 100, (g % 500) + 0.99, ARRAY['web'] FROM generate_series(1, 1000) g;

"""Per-key concurrency: at most N jobs with the same key run at once, and a job
whose key is full waits outside the queue without holding a worker thread.

``keys`` turns an actor's declaration into a key per message; ``slots`` holds the
Redis side (take a slot or park, free it and start the next parked job, free the
slots of dead workers). A worker's fetch takes a job's slot with the job (or the
consumer, ``jobs.broker.acks``, right after it, for a job sent without its key);
the Concurrency middleware frees it when the job ends.
"""

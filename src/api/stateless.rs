//! Embeddings and rerank: requests without a conversation and without a prompt cache worth
//! keeping. They take no lease (a 100,000-chunk indexing job must not make 100,000 leases): each
//! goes to the chooser's pick among the route's candidates, and takes a limiter slot, because
//! llama-server runs them in its slots. Their answers are plain JSON with a chat-style `usage`.

/// Every path llama-server (b11434) serves embeddings and rerank on.
pub(super) const PATHS: &[&str] = &[
    "/v1/embeddings",
    "/embeddings",
    "/embedding",
    "/rerank",
    "/reranking",
    "/v1/rerank",
    "/v1/reranking",
];

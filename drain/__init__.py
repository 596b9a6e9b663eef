"""Above the store: the upload engine (when a file goes and how), the read path (the shared
namespace, fetches and warm-ups) and retention."""

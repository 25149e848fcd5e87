//! docker-compose.yml is for users; no Docker engine runs here, so this checks what can be checked
//! without one. (Filled in by the compose work.)

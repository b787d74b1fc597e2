//! Remote environments: the HTTP protocol, the server behind `rollflash env-serve`, and the `Env` that talks to it.

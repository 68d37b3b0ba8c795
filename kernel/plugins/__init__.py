"""Third-party tool plugins (design: Plugin System Module).

``manifest`` (the one manifest model, built-ins included), ``store`` (the plugin store
under fluffy's home: copies, file hashes), ``scan`` (reading a plugin folder),
``registry`` (the lifecycle, persisted in SQLite), ``handshake`` (API version window),
``precheck`` (required capabilities against policy), ``install`` (the reviewed install
flow of ``fluffy plugin install``) and ``activate`` (the kernel's start-up: installed and
enabled plugins become tools).
"""

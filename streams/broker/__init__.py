"""The local Kafka cluster (KRaft on 127.0.0.1, jars from Maven Central), one concept a module: the jars and the JVM
(`jars`), the cluster's directory (`files`), `server.properties` with SASL and the authorizer (`properties`), the
storage formatted before a node's first start (`storage`), a node as a process (`nodes`), readiness (`readiness`),
the cluster's CA and node certificate (`tls`), the roles' logins and ACLs (`roles`), and the cluster started,
stopped and described from them (`local_broker`)."""

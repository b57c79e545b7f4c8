"""Install-time tooling, outside the runtime package: the local JARs and the deployment bundles."""

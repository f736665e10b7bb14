"""The maintenance services: the reaper and liveness, the singletons' seeding, the hourly
housekeeping and retention, and the watches that alert when something stops moving."""

-- Orders appended incrementally: only offsets beyond those already loaded, per partition.
-- Kafka offsets only grow within a partition and the platform commits them in order, so this
-- adds exactly the new records (no timestamp guesswork).
{{ config(materialized='incremental', unique_key='order_id') }}

select *
from {{ ref('stg_orders') }} as s
{% if is_incremental() %}
where s._kafka_offset > coalesce(
    (select max(t._kafka_offset) from {{ this }} as t where t._kafka_partition = s._kafka_partition),
    -1
)
{% endif %}

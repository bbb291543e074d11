-- One row per order: typed, cleaned, and without upstream duplicates.
-- Kafka may hold the same order twice (a producer retry); the ingested table keeps both offsets
-- by design, and this model keeps the first occurrence by Kafka position.
with source as (
    select * from {{ source('demo', 'orders') }}
),

cleaned as (
    select
        order_id,
        customer_id,
        lower(trim(status)) as status,
        upper(trim(currency)) as currency,
        cast(amount as decimal(12, 2)) as amount,
        items,
        lower(channel) as channel,
        created_at,
        cast(created_at as date) as order_date,
        _kafka_partition,
        _kafka_offset,
        _kafka_timestamp
    from source
    where order_id is not null
)

select *
from cleaned
qualify row_number() over (
    partition by order_id order by _kafka_timestamp, _kafka_partition, _kafka_offset
) = 1
